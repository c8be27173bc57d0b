// A stage's parts from its layout: GPT-2's or Llama's layers, embedding and head (see
// stage_parts.h).
#include "model/stage_parts.h"

#include <memory>
#include <utility>

#include "model/grouped_attention.h"

namespace trident::model {

namespace {

// The adapter of target t of layer l, if it has one, over the columns first .. first + width
// of its linear's output (width 0: all of them).
void add_adapter(LinearSpec& s, const ParamLayout& lora_layout, const Lora& lora, int l,
                 LoraTarget t, int first = 0, int width = 0) {
    if (!lora.shape.has(t)) return;
    const LayerLora& factors = lora_layout.layer_lora(l);
    const std::size_t i = static_cast<std::size_t>(t);
    s.lora.push_back(LoraSpec{factors.a[i], factors.b[i], lora.shape.rank, lora.scale, lora.dropout,
                              static_cast<int>(t), first, width});
}

// Linear t of layer l: its split, this rank's widths, its offsets, and its adapter if any.
LinearSpec linear(const ParamLayout& lora_layout, const Lora& lora, int l, LoraTarget t,
                  LinearSplit split, int in, int out, std::size_t weight, std::size_t bias) {
    LinearSpec s{split, in, out, weight, bias, {}, true};
    add_adapter(s, lora_layout, lora, l, t);
    return s;
}

// GPT-2's layer l: LayerNorm, attention (qkv column-split by heads, the projection
// row-split), LayerNorm, the GELU MLP (fc column-split, fc_proj row-split).
TransformerLayer gpt2_layer(const ParamLayout& layout, const ParamLayout& lora_layout, int l,
                            const Dims& d, const PartOptions& o, ScratchSpec& scratch) {
    const LayerParams& p = layout.layer(l);
    const Lora& lora = o.lora;
    SetSpec set;
    TransformerLayer::Parts parts;
    parts.norm1 = std::make_unique<LayerNorm>(p.ln1_w, p.ln1_b, d, set);
    SelfAttentionSpec attention;
    attention.qkv = linear(lora_layout, lora, l, LoraTarget::qkv, LinearSplit::column, d.H,
                           3 * d.Hm, p.qkv_w, p.qkv_b);
    attention.proj = linear(lora_layout, lora, l, LoraTarget::attn_proj, LinearSplit::row, d.Hm,
                            d.H, p.attn_proj_w, p.attn_proj_b);
    attention.head_begin = layout.heads_begin();
    attention.heads_total = layout.shape().heads;
    attention.make_core = o.make_core;
    parts.attention =
        std::make_unique<SelfAttention>(attention, d, o.attention_saved, set, scratch);
    parts.norm2 = std::make_unique<LayerNorm>(p.ln2_w, p.ln2_b, d, set);
    parts.feed_forward =
        std::make_unique<Mlp>(MlpActivation::gelu,
                              linear(lora_layout, lora, l, LoraTarget::fc, LinearSplit::column, d.H,
                                     d.Fm, p.fc_w, p.fc_b),
                              linear(lora_layout, lora, l, LoraTarget::fc_proj, LinearSplit::row,
                                     d.Fm, d.H, p.fc_proj_w, p.fc_proj_b),
                              d, set, scratch);
    return TransformerLayer(std::move(set), std::move(parts), o.dropout, d, scratch);
}

// Llama's layer l: RMSNorm, grouped-query attention with rotary positions (q, k, v one
// column-split linear by heads, o row-split), RMSNorm, SwiGLU (gate and up one column-split
// linear, down row-split); no biases. Each of the seven linears may carry an adapter.
TransformerLayer llama_layer(const ParamLayout& layout, const ParamLayout& lora_layout, int l,
                             const Dims& d, const PartOptions& o, ScratchSpec& scratch) {
    const LayerParams& p = layout.layer(l);
    const GptShape& shape = layout.shape();
    const Lora& lora = o.lora;
    const int KVm = d.kv_heads * (d.Hm / d.heads);  // this rank's key/value width
    SetSpec set;
    TransformerLayer::Parts parts;
    parts.norm1 = std::make_unique<RmsNorm>(p.ln1_w, shape.norm_eps, d, set);
    GroupedAttentionSpec attention;
    // q, k and v one linear, (N, Hm + 2·KVm): each adapter adds to its block of columns.
    attention.qkv =
        LinearSpec{LinearSplit::column, d.H, d.Hm + 2 * KVm, p.qkv_w, kNoParam, {}, true};
    add_adapter(attention.qkv, lora_layout, lora, l, LoraTarget::q, 0, d.Hm);
    add_adapter(attention.qkv, lora_layout, lora, l, LoraTarget::k, d.Hm, KVm);
    add_adapter(attention.qkv, lora_layout, lora, l, LoraTarget::v, d.Hm + KVm, KVm);
    attention.proj = linear(lora_layout, lora, l, LoraTarget::o, LinearSplit::row, d.Hm, d.H,
                            p.attn_proj_w, kNoParam);
    attention.head_begin = layout.heads_begin();
    attention.heads_total = shape.heads;
    attention.rope_theta = shape.rope_theta;
    attention.make_core = o.make_core;
    parts.attention =
        std::make_unique<GroupedAttention>(attention, d, o.attention_saved, set, scratch);
    parts.norm2 = std::make_unique<RmsNorm>(p.ln2_w, shape.norm_eps, d, set);
    // gate and up one linear, (N, 2Fm).
    LinearSpec gate_up{LinearSplit::column, d.H, 2 * d.Fm, p.fc_w, kNoParam, {}, true};
    add_adapter(gate_up, lora_layout, lora, l, LoraTarget::gate, 0, d.Fm);
    add_adapter(gate_up, lora_layout, lora, l, LoraTarget::up, d.Fm, d.Fm);
    parts.feed_forward =
        std::make_unique<Mlp>(MlpActivation::swiglu, gate_up,
                              linear(lora_layout, lora, l, LoraTarget::down, LinearSplit::row, d.Fm,
                                     d.H, p.fc_proj_w, kNoParam),
                              d, set, scratch);
    return TransformerLayer(std::move(set), std::move(parts), o.dropout, d, scratch);
}

// The final norm before the LM head, into the last chunk's own buffers.
std::unique_ptr<Norm> final_norm(const ParamLayout& layout, const Dims& d, SetSpec& set) {
    if (layout.shape().arch == Arch::llama)
        return std::make_unique<RmsNorm>(layout.lnf_w(), layout.shape().norm_eps, d, set);
    return std::make_unique<LayerNorm>(layout.lnf_w(), layout.lnf_b(), d, set);
}

}  // namespace

StageParts build_stage(const ParamLayout& layout, const ParamLayout& lora_layout, const Dims& d,
                       const PartOptions& options) {
    const StagePlan& plan = layout.plan();
    const int last = plan.stages * plan.chunks - 1;
    StageParts s;
    // The backward's gradient of this rank's rows of the residual stream (R, H).
    s.d_residual =
        s.scratch.add("d_residual", d.rows_mine() * static_cast<std::size_t>(d.H), d.act);
    if (d.T < d.seq_len)
        s.positions =
            s.scratch.add("positions", static_cast<std::size_t>(d.T), kernels::DType::i32);
    const bool llama = layout.shape().arch == Arch::llama;
    for (int c = 0; c < plan.chunks; ++c) {
        s.chunk_first.push_back(s.layers.size());
        for (int i = 0; i < layout.chunk_layers(c); ++i) {
            const int l = layout.first_layer(c) + i;
            s.layers.push_back(llama ? llama_layer(layout, lora_layout, l, d, options, s.scratch)
                                     : gpt2_layer(layout, lora_layout, l, d, options, s.scratch));
        }
    }
    s.chunks.resize(static_cast<std::size_t>(plan.chunks));
    std::size_t next = 0;
    for (int c = 0; c < plan.chunks; ++c) {
        ChunkSpec& chunk = s.chunks[static_cast<std::size_t>(c)];
        s.chunk_input.push_back(chunk.own.add(
            "input", d.rows_mine() * static_cast<std::size_t>(d.H), d.act, Keep::always));
        if (plan.global_chunk(c) == 0)
            s.embedding.emplace(
                EmbeddingSpec{layout.wte(), layout.wpe(), layout.vocab_begin(), options.dropout}, d,
                chunk.own, s.scratch);
        if (plan.global_chunk(c) == last)
            s.head.emplace(LmHeadSpec{layout.head(), layout.vocab_begin(), layout.shape().vocab},
                           final_norm(layout, d, chunk.own), d, chunk.own, s.scratch);
        for (int i = 0; i < layout.chunk_layers(c); ++i)
            chunk.layers.push_back(&s.layers[next++].spec());
    }
    return s;
}

}  // namespace trident::model
