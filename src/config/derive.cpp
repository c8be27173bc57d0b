// The values computed once from a config: padded vocabulary, batch split, parameter count and
// model FLOPs per step (docs/FORMULAS.md, "Parameters" and "FLOPs per step"), the layers of
// each pipeline chunk (config/stage_cuts.h).
#include "config/config.h"
#include "config/stage_cuts.h"

namespace trident::config {
namespace {

int64_t round_up(int64_t value, int64_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
}

// Unique parameters of the model, padded rows excluded (docs/FORMULAS.md, "Parameters").
// GPT-2: token and position embeddings, the layers, the final LN; the LM head is tied to the
// token embedding, so it adds nothing. Llama: the token embedding, the layers (q and o H×H,
// k and v H×(KVH·d) each, SwiGLU's three H×F, two RMSNorm gains), the final RMSNorm, and the
// LM head's V×H unless tied.
int64_t count_parameters(const ModelConfig& m) {
    const int64_t V = m.vocab_size, T = m.seq_len, H = m.hidden, F = m.ffn_hidden, L = m.layers;
    if (m.arch == Arch::llama) {
        const int64_t kv = H / m.heads * m.kv_heads;
        const int64_t per_layer = 2 * H * H + 2 * H * kv + 3 * H * F + 2 * H;
        return V * H * (m.tie_embeddings ? 1 : 2) + L * per_layer + H;
    }
    const int64_t per_layer = 2 * H                // ln1 weight and bias
                              + 3 * H * H + 3 * H  // qkv
                              + H * H + H          // attention projection
                              + 2 * H              // ln2
                              + F * H + F          // fc
                              + H * F + H;         // fc_proj
    return V * H + T * H + L * per_layer + 2 * H;  // + ln_f
}

// in + out of the linear a LoRA target adapts (kv: llama's key/value width).
double lora_widths(LoraTarget target, double h, double kv, double F) {
    switch (target) {
        case LoraTarget::qkv:
            return 4.0 * h;
        case LoraTarget::attn_proj:
        case LoraTarget::q:
        case LoraTarget::o:
            return 2.0 * h;
        case LoraTarget::k:
        case LoraTarget::v:
            return h + kv;
        case LoraTarget::fc:
        case LoraTarget::fc_proj:
        case LoraTarget::gate:
        case LoraTarget::up:
        case LoraTarget::down:
            break;
    }
    return h + F;
}

// Megatron's model FLOPs for one global batch (training.py, causal attention counted at
// half, no recompute): 72·B·s·l·h²·(1 + s/(12h) + V/(12·l·h)), three times the forward's
// 24·B·s·l·h²·(1 + V/(12·l·h)) in the weights' GEMMs and 2·B·s²·l·h in attention's. Under
// low-rank adapters the frozen weights get no weight gradient, so their GEMMs run twice the
// forward's (forward, input gradient), attention's still three times, and each adapter
// (A (r, in), B (out, r)) adds three times its forward's 2·B·s·r·(in + out) per layer.
// Llama's weights count by their shapes instead: 2·B·s per weight of the layers (q and o
// h², k and v h·kv each, SwiGLU's three h·F) and of the LM head (V·h).
double model_flops(const ModelConfig& m, const TrainingConfig& t) {
    const double B = t.global_batch, s = m.seq_len, l = m.layers, h = m.hidden, V = m.vocab_size;
    const double kv = h / m.heads * m.kv_heads, F = m.ffn_hidden;
    const double weights = m.arch == Arch::llama
                               ? 2.0 * B * s * (l * (2 * h * h + 2 * h * kv + 3 * h * F) + V * h)
                               : 24.0 * B * s * l * h * h * (1.0 + V / (12.0 * l * h));
    const double attention = 2.0 * B * s * s * l * h;
    if (!t.lora.enabled()) return 3.0 * (weights + attention);
    double widths = 0;  // Σ (in + out) over the targets
    for (const LoraTarget target : t.lora.targets) widths += lora_widths(target, h, kv, F);
    const double adapters = 2.0 * B * s * l * t.lora.rank * widths;
    return 2.0 * weights + 3.0 * (attention + adapters);
}

}  // namespace

void derive(Config& cfg) {
    const ModelConfig& m = cfg.model;
    const ParallelConfig& p = cfg.parallel;
    const TrainingConfig& t = cfg.training;
    Derived& d = cfg.derived;

    // The vocabulary is split over M, and each shard stays a multiple of 128 for fast GEMMs.
    d.padded_vocab = static_cast<int>(round_up(m.vocab_size, 128 * int64_t{p.tensor}));
    d.head_dim = m.heads > 0 ? m.hidden / m.heads : 0;
    d.world_size = p.pipeline * p.tensor * p.context * p.data;
    const int per_step = t.micro_batch * p.data;
    d.grad_accum_steps = per_step > 0 ? t.global_batch / per_step : 0;
    d.tokens_per_step = int64_t{t.global_batch} * m.seq_len;
    d.parameters = count_parameters(m);
    d.flops_per_step = model_flops(m, t);
    d.chunk_layers = chunk_layers(cfg);  // reads padded_vocab, set above
}

}  // namespace trident::config
