// Per-stage memory of a training run (see memory_model.h).
#include "plan/memory_model.h"

#include "model/param_layout.h"
#include "plan/stage_shape.h"
#include "train/model_shape.h"

namespace trident::plan {

namespace {

// The step's two device totals, the loss and the gradient norm's square (model/gpt.h,
// optim/adamw.h): a double each, in the backend's smallest allocation (64 bytes on the CPU;
// a GPU's caching allocator rounds them up further, a few hundred bytes in all).
constexpr int64_t kDeviceTotals = 2 * 64;
constexpr int64_t kFp32 = 4;  // LayerNorm statistics, loss statistics, token ids (int32)

// Bytes of one layer's buffers in a set (model/gpt.cpp, Gpt::allocate_layer): `work` the
// intermediates backward reads, `att` what attention keeps (the CPU: the probabilities),
// `output` the layer's output.
int64_t layer_bytes(const RankDims& d, bool work, bool att, bool output, int64_t act) {
    int64_t bytes = 0;
    if (work) {
        const int64_t elements = 3 * d.R * d.C       // ln1, resid2, ln2
                                 + 2 * d.all_rows()  // ln1, ln2 of all rows
                                 + 3 * d.N * d.Cm    // qkv
                                 + d.N * d.Cm        // attention output
                                 + 2 * d.N * d.Fm;   // fc1, GELU
        bytes += elements * act + 4 * d.R * kFp32;   // + LayerNorm mean and rstd, twice
        if (d.context > 1 && !d.ring) bytes += d.N * d.Cm * act;  // Ulysses' head-split output
    }
    if (att) bytes += d.attention_bytes(act);
    if (output) bytes += d.R * d.C * act;
    return bytes;
}

// One (microbatch, chunk) set (Gpt::new_activations). With a split backward it also holds
// what B keeps for W: per layer the gradients of the outputs of the four linears (N,C),
// (N,F/M), (N,C), (N,3C/M) and of the two LayerNorms (R,C) each; the final LayerNorm's and
// the embedding's (R,C).
int64_t set_bytes(const RankDims& d, const ChunkShape& chunk, config::Recompute recompute,
                  bool split_backward, int64_t act) {
    using config::Recompute;
    int64_t bytes = d.R * d.C * act;  // the chunk's input
    bytes += chunk.layers *
             layer_bytes(d, recompute != Recompute::full, d.keeps_attention(recompute), true, act);
    if (split_backward) {
        bytes += chunk.layers * (2 * d.N * d.C + d.N * d.Fm + 3 * d.N * d.Cm + 2 * d.R * d.C) * act;
        if (chunk.head) bytes += d.R * d.C * act;
        if (chunk.embeds) bytes += d.R * d.C * act;
    }
    if (chunk.embeds) bytes += d.N * kFp32 + d.all_rows() * act;  // token ids, partial sums
    if (chunk.head)
        bytes += d.N * kFp32                                           // targets
                 + (d.R * d.C + d.all_rows()) * act + 2 * d.R * kFp32  // final LayerNorm
                 + d.N * d.vocab * act                                 // logits
                 + 6 * d.N * kFp32;  // loss statistics, lse, losses
    return bytes;
}

// Context parallelism's buffers (model/context_attention.h): ring, the keys and values held
// and arriving (N, 2C/M) each, their fp32 gradients likewise, the running output and a block's
// (N, C/M) fp32, a block's log-sum-exp (B, NH/M, T) fp32; Ulysses, the exchange's buffers and
// the token-split q, k, v (N, 3C/M) each and the head-split output gradient (N, C/M).
int64_t context_bytes(const RankDims& d, int64_t act) {
    if (d.ring)
        return 2 * d.N * 2 * d.Cm * act + 2 * d.N * 2 * d.Cm * kFp32 + 2 * d.N * d.Cm * kFp32 +
               d.B * d.heads * d.T * kFp32;
    return 3 * d.N * 3 * d.Cm * act + d.N * d.Cm * act;
}

// The scratch the model allocates once (Gpt::Gpt), the CPU backend's attention workspace,
// the recompute scratch, and the step's device totals.
int64_t scratch_bytes(const RankDims& d, config::Recompute recompute, int64_t act) {
    using config::Recompute;
    const int64_t own_rows = d.sequence_parallel ? d.R * d.C : 0;
    const int64_t elements = 3 * d.N * d.C      // a row-parallel output; two gradients (N, C)
                             + own_rows         // its reduced rows
                             + 2 * d.R * d.C    // gradients of the residual stream's rows
                             + d.all_rows()     // a gradient gathered to all rows
                             + 2 * d.N * d.Fm   // MLP gradients
                             + 3 * d.N * d.Cm;  // qkv gradient
    // + attention probabilities' gradient (CpuOps)
    int64_t bytes = elements * act + d.attention_workspace_bytes(act) + kDeviceTotals;
    if (recompute != Recompute::none)
        bytes +=
            layer_bytes(d, recompute == Recompute::full, !d.keeps_attention(recompute), false, act);
    if (d.context > 1) bytes += d.T * kFp32 + context_bytes(d, act);  // + the tokens' positions
    return bytes;
}

}  // namespace

int weight_bytes(kernels::DType precision) {
    return precision == kernels::DType::f32 ? 4 : 2;
}

int gradient_bytes(kernels::DType precision, bool fp32_grad_accumulation) {
    return precision == kernels::DType::f32 || fp32_grad_accumulation ? 4 : 2;
}

int activation_bytes(kernels::DType precision) {
    return precision == kernels::DType::f32 ? 4 : 2;
}

PlanInputs plan_inputs(const config::Config& cfg, int grad_bytes) {
    PlanInputs in;
    in.cfg = cfg;
    in.weight_bytes = weight_bytes(cfg.training.precision);
    in.grad_bytes = grad_bytes;
    in.activation_bytes = activation_bytes(cfg.training.precision);
    in.zero_stage = cfg.parallel.zero_stage;
    return in;
}

ModelStates model_states(double parameters, int data_parallel, int zero_stage, int weight_bytes,
                         int grad_bytes) {
    const double D = data_parallel;
    ModelStates s;
    s.weights = parameters * weight_bytes / (zero_stage >= 3 ? D : 1.0);
    s.gradients = parameters * grad_bytes / (zero_stage >= 2 ? D : 1.0);
    s.optimizer = parameters * kOptimizerBytes / (zero_stage >= 1 ? D : 1.0);
    return s;
}

double korthikanti_layer_bytes(const config::Config& cfg) {
    using config::Recompute;
    const double s = cfg.model.seq_len, b = cfg.training.micro_batch, h = cfg.model.hidden,
                 a = cfg.model.heads, t = cfg.parallel.tensor;
    const bool sp = cfg.parallel.sequence_parallel && t > 1;
    const double sbh = s * b * h;
    switch (cfg.training.recompute) {
        case Recompute::full:
            return (sp ? 2 * sbh / t : 2 * sbh) / cfg.parallel.context;
        case Recompute::selective:
            return (sp ? 34 * sbh / t : sbh * (10 + 24 / t)) / cfg.parallel.context;
        case Recompute::none:
            break;
    }
    const double attention = 5 * a * s / (h * t);
    // Context parallelism holds a C-th of every term (s/C tokens, their scores against all s).
    const double C = cfg.parallel.context;
    return (sp ? sbh * (34 / t + attention) : sbh * (10 + 24 / t + attention)) / C;
}

std::vector<StageMemory> plan_memory(const PlanInputs& in) {
    const config::Config& cfg = in.cfg;
    const auto& p = cfg.parallel;
    const RankDims d = rank_dims(cfg);
    const int64_t act = in.activation_bytes;
    const double korthikanti_layer = korthikanti_layer_bytes(cfg) * act / 2.0;
    std::vector<StageMemory> stages;
    for (int stage = 0; stage < p.pipeline; ++stage) {
        StageMemory s;
        s.stage = stage;
        // Padded so that ZeRO splits it evenly over the replicas (Gpt's buffer_multiple): the
        // D·C ranks of the data-context group; at stages 2 and 3 each unit of the layout is
        // (model/param_layout.h; ZeRO 2 and 3 run with C = 1).
        const int64_t D = int64_t{p.data} * p.context;
        const model::ParamLayout layout(train::gpt_shape(cfg), 0, p.tensor,
                                        train::stage_plan(cfg, stage),
                                        in.zero_stage >= 2 ? p.data : 1);
        s.parameters = (static_cast<int64_t>(layout.total()) + D - 1) / D * D;
        s.states = model_states(static_cast<double>(s.parameters), static_cast<int>(D),
                                in.zero_stage, in.weight_bytes, in.grad_bytes);

        const std::vector<ChunkShape> chunks = stage_chunks(cfg, stage);
        const InFlight flight = in_flight(cfg, stage);
        for (std::size_t c = 0; c < chunks.size(); ++c) {
            const int sets = flight.sets[c];
            s.activation_sets += sets;
            s.activations += static_cast<double>(sets) *
                             set_bytes(d, chunks[c], cfg.training.recompute,
                                       pipeline::splits_backward(schedule_kind(cfg)), act);
            s.korthikanti += sets * chunks[c].layers * korthikanti_layer;
        }
        s.temporary = static_cast<double>(scratch_bytes(d, cfg.training.recompute, act) +
                                          flight.messages * d.R * d.C * act);
        stages.push_back(s);
    }
    return stages;
}

}  // namespace trident::plan
