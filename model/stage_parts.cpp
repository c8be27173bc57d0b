// A stage's parts from its layout: each layer's parts as its spec names them, the embedding and
// the head (see stage_parts.h).
#include "model/stage_parts.h"

#include <memory>
#include <utility>

namespace trident::model {

LinearSpec PartBuild::linear(LinearSplit split, int in, int out, std::size_t weight,
                             std::size_t bias) const {
    return LinearSpec{split, in, out, weight, bias, {}, true, options.gemm};
}

void PartBuild::adapt(LinearSpec& linear, LoraTarget t, int first, int width) const {
    const Lora& lora = options.lora;
    if (!lora.shape.has(t)) return;
    const LayerLora& factors = lora_layout->layer_lora(layer);
    const std::size_t i = static_cast<std::size_t>(t);
    linear.lora.push_back(LoraSpec{factors.a[i], factors.b[i], lora.shape.rank, lora.scale,
                                   lora.dropout, static_cast<int>(t), first, width});
}

namespace {

// Layer l from the parts its spec names: norm, attention, norm, MLP, each built from its
// tensors' offsets, declaring its buffers into the layer's set in that order.
TransformerLayer build_layer(const ParamLayout& layout, const ParamLayout& lora_layout, int l,
                             const Dims& d, const PartOptions& o, ScratchSpec& scratch) {
    const LayerSpec& spec = layout.spec().layers[static_cast<std::size_t>(l)];
    const LayerTensors& tensors = layout.layer(l);
    SetSpec set;
    const auto in = [&](LayerPart p) {
        return PartBuild{layout.spec(), d, tensors.of(p), l, &lora_layout, o, set, scratch};
    };
    TransformerLayer::Parts parts;
    parts.norm1 = spec.norm->build(in(LayerPart::norm1));
    const std::size_t attention_buffers = set.buffers().size();
    parts.attention = spec.attention->build(in(LayerPart::attention));
    // What the attention's W reads may wait for the next layer's exchange (Keep::deferrable).
    set.make_deferrable(attention_buffers);
    parts.norm2 = spec.norm->build(in(LayerPart::norm2));
    parts.feed_forward = spec.mlp->build(in(LayerPart::mlp));
    return TransformerLayer(std::move(set), std::move(parts), o.dropout, d, scratch);
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
    for (int c = 0; c < plan.chunks; ++c) {
        s.chunk_first.push_back(s.layers.size());
        for (int i = 0; i < layout.chunk_layers(c); ++i)
            s.layers.push_back(
                build_layer(layout, lora_layout, layout.first_layer(c) + i, d, options, s.scratch));
    }
    s.chunks.resize(static_cast<std::size_t>(plan.chunks));
    std::size_t next = 0;
    for (int c = 0; c < plan.chunks; ++c) {
        ChunkSpec& chunk = s.chunks[static_cast<std::size_t>(c)];
        s.chunk_input.push_back(chunk.own.add(
            "input", d.rows_mine() * static_cast<std::size_t>(d.H), d.act, Keep::always));
        s.chunk_documents.push_back(
            options.documents ? chunk.own.add("documents", Documents::elements(d.B, d.seq_len, d.T),
                                              kernels::DType::i32, Keep::always)
                              : -1);
        if (plan.global_chunk(c) == 0)
            s.embedding.emplace(
                EmbeddingSpec{layout.wte(), layout.wpe(), layout.vocab_begin(), options.dropout}, d,
                chunk.own, s.scratch);
        if (plan.global_chunk(c) == last) {
            const ModelSpec& spec = layout.spec();
            std::unique_ptr<Norm> norm = spec.final_norm->build(PartBuild{
                spec, d, layout.final_norm(), -1, &lora_layout, options, chunk.own, s.scratch});
            s.head.emplace(LmHeadSpec{layout.head(), layout.vocab_begin(), layout.shape().vocab},
                           std::move(norm), d, chunk.own, s.scratch);
        }
        for (int i = 0; i < layout.chunk_layers(c); ++i)
            chunk.layers.push_back(&s.layers[next++].spec());
    }
    return s;
}

std::vector<const SetSpec*> StageParts::layer_specs() const {
    std::vector<const SetSpec*> specs;
    for (const TransformerLayer& layer : layers) specs.push_back(&layer.spec());
    return specs;
}

}  // namespace trident::model
