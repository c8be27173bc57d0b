// The GPT model on one rank: its chunks' forward and backward, and the hooks of the
// data-parallel part around each unit (see model/gpt.h).
#include "model/gpt.h"

#include <algorithm>
#include <string>

#include "kernels/error.h"
#include "model/context_split.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

std::size_t round_up(std::size_t n, std::size_t multiple) {
    return (n + multiple - 1) / multiple * multiple;
}

// The flat buffers: whole (padded to the data-parallel size), or sharded by the layout's
// units (ZeRO-2: gradients, ZeRO-3: parameters too). A frozen model has no gradients: its
// adapters have, in buffers of their own, sharded alike by their units (one per layer).
Weights make_weights(kernels::Ops& ops, const GptOptions& o, const ParamLayout& layout,
                     const ParamLayout& lora_layout) {
    const Sharding& sharding = o.sharding;
    const std::size_t multiple = o.buffer_multiple;
    const int replicas = static_cast<int>(multiple);
    const auto buffer = [&](const ParamLayout& of, bool sharded, kernels::DType dtype) {
        return sharded ? FlatBuffer(ops, of.unit_ranges(), replicas, sharding.replica, dtype)
                       : FlatBuffer(ops, round_up(of.total(), multiple), dtype);
    };
    Weights w;
    w.frozen = o.lora.shape.rank > 0;
    w.params = buffer(layout, sharding.params, o.precision.params);
    w.grads = w.frozen ? FlatBuffer(ops, 0, o.precision.grads)
                       : buffer(layout, sharding.grads, o.precision.grads);
    if (!w.frozen) return w;
    w.lora_params = buffer(lora_layout, sharding.params, o.precision.params);
    w.lora_grads = buffer(lora_layout, sharding.grads, o.precision.grads);
    return w;
}

// A hook on a range, unless the range is empty.
void call(const std::function<void(std::size_t, std::size_t)>& hook,
          std::pair<std::size_t, std::size_t> r) {
    if (hook && r.first < r.second) hook(r.first, r.second);
}

Dims dims_of(const GptOptions& o, const ModelGroups& groups) {
    return make_dims(o.shape, DimsInputs{o.micro_batch, groups.tensor.size(), groups.tensor.rank(),
                                         groups.context.size(), o.sequence_parallel, o.tp_overlap,
                                         o.context_mode, o.precision.activations});
}

}  // namespace

Gpt::Gpt(kernels::Ops& ops, const GptOptions& options, const ModelGroups& groups)
    : ops_(ops),
      options_(options),
      layout_(options.shape, groups.tensor.rank(), groups.tensor.size(), options.plan,
              options.sharding.grads ? static_cast<int>(options.buffer_multiple) : 1),
      lora_layout_(ParamLayout::for_lora(
          options.shape, options.lora.shape, groups.tensor.rank(), groups.tensor.size(),
          options.plan, options.sharding.grads ? static_cast<int>(options.buffer_multiple) : 1)),
      d_(dims_of(options, groups)),
      rows_(ops, groups.tensor, d_,
            context_positions(options.shape.max_seq, groups.context.size(), groups.context.rank())),
      weights_(make_weights(ops, options, layout_, lora_layout_)),
      parts_(build_stage(layout_, lora_layout_, d_,
                         PartOptions{options.dropout,
                                     options.lora,
                                     [&ops](int B, int heads, int T, kernels::DType act) {
                                         return ops.attention_saved(B, heads, T, act);
                                     },
                                     {}})),
      scratch_(ops, parts_.scratch.buffers()),
      ctx_{ops, rows_, groups.context, groups.kv_replicas, weights_, scratch_},
      store_(ops, options.recompute, parts_.chunks, parts_.layer_spec()),
      loss_sum_(ops, 1, kernels::DType::f64) {
    if (parts_.positions >= 0) {
        const std::vector<int32_t> positions =
            context_positions(options.shape.max_seq, groups.context.size(), groups.context.rank());
        ops.upload(scratch_[parts_.positions].data, positions.data(),
                   positions.size() * sizeof(int32_t));
    }
}

bool Gpt::has_head(int c) const {
    const StagePlan& plan = layout_.plan();
    return plan.global_chunk(c) == plan.stages * plan.chunks - 1;
}

Ptr Gpt::chunk_input(int c, const Set& set) const {
    return set.own[static_cast<std::size_t>(parts_.chunk_input[static_cast<std::size_t>(c)])]
        .data();
}

ConstPtr Gpt::layer_input(int c, const Set& set, int i) const {
    if (i == 0) return chunk_input(c, set);
    const SetBuffers previous = store_.layer(set, c, i - 1);
    const Pass pass{previous, set.training, set.seed, layout_.first_layer(c) + i - 1};
    return parts_.layer(c, i - 1).output(pass);
}

ConstPtr Gpt::chunk_output(int c, const Set& set) const {
    return layer_input(c, set, layout_.chunk_layers(c));
}

// ---- forward ---------------------------------------------------------------------------------

void Gpt::forward_chunk(int mb, int c, const int32_t* inputs, const int32_t* targets,
                        ConstPtr input, Ptr output, bool training, uint64_t dropout_seed) {
    Set& set = store_.start(mb, c);
    set.training = training;
    set.seed = dropout_seed;
    run_forward(c, set, inputs, input);
    if (has_head(c)) {
        const SetBuffers own = store_.own(set);
        const Pass pass{own, training, dropout_seed, shape().layers};
        parts_.head->loss(ctx_, pass, targets, static_cast<double*>(loss_sum_.data().data));
    } else {
        ops_.copy(output, chunk_output(c, set), boundary_size());
    }
    if (!training) store_.release(mb, c);
}

double Gpt::take_loss_sum() {
    double sum = 0.0;
    ops_.download(&sum, loss_sum_.data().data, sizeof(sum));
    ops_.zero(loss_sum_.data(), 1);
    return sum;
}

void Gpt::run_forward(int c, Set& set, const int32_t* inputs, ConstPtr input) {
    const SetBuffers own = store_.own(set);
    const Pass own_pass{own, set.training, set.seed, -1};
    const Ptr x = chunk_input(c, set);
    if (embeds(c)) {
        params_needed(embedding_range());
        params_prefetch(next_in_forward(c, -1));
        parts_.embedding->forward(ctx_, own_pass, inputs, x);
        // A tied wte is the head's too: the head lets it go.
        if (!has_head(c) || !shape().tied) params_done(embedding_range());
    } else {
        ops_.copy(x, input, boundary_size());
    }
    const int first = layout_.first_layer(c);
    for (int i = 0; i < layout_.chunk_layers(c); ++i) {
        const SetBuffers buffers = store_.layer(set, c, i);
        const Pass pass{buffers, set.training, set.seed, first + i};
        params_needed(layout_.layer_range(first + i));
        params_prefetch(next_in_forward(c, i));
        const TransformerLayer& layer = parts_.layer(c, i);
        layer.forward(ctx_, pass, layer_input(c, set, i), layer.output(pass));
        params_done(layout_.layer_range(first + i));
    }
    if (!has_head(c)) return;
    params_needed(lnf_range());
    params_needed(wte_range());
    parts_.head->forward(ctx_, own_pass, chunk_output(c, set));
    params_done(lnf_range());
    params_done(wte_range());
}

std::vector<float> Gpt::logits_at(const int32_t* inputs, int position) {
    const StagePlan& plan = layout_.plan();
    if (layout_.tensor_size() != 1 || plan.stages != 1 || plan.chunks != 1 || d_.context_size != 1)
        throw Error("generation runs on one process (parallel.tensor = pipeline = context = 1)");
    const GptShape& s = layout_.shape();
    Set& set = store_.start(0, 0);
    set.training = false;
    run_forward(0, set, inputs, nullptr);
    std::vector<float> row(static_cast<std::size_t>(s.vocab));  // padded columns dropped
    const SetBuffers own = store_.own(set);
    const Pass pass{own, false, 0, s.layers};
    ops_.copy_to_host(
        row.data(), parts_.head->logits(pass) + static_cast<std::size_t>(position) * s.padded_vocab,
        row.size());
    store_.release(0, 0);
    return row;
}

// ---- backward --------------------------------------------------------------------------------

void Gpt::backward_chunk(int mb, int c, float dloss, ConstPtr output_grad, Ptr input_grad,
                         bool last) {
    backward_part(mb, c, dloss, output_grad, input_grad, BackwardPart::both, last);
}

void Gpt::backward_input(int mb, int c, float dloss, ConstPtr output_grad, Ptr input_grad) {
    if (!split_backward()) throw Error("internal: a split backward on a model not set up for it");
    backward_part(mb, c, dloss, output_grad, input_grad, BackwardPart::input, false);
}

void Gpt::backward_weight(int mb, int c, bool last) {
    backward_part(mb, c, 0.0f, {}, {}, BackwardPart::weight, last);
}

void Gpt::set_split_backward(bool on) {
    store_.set_split_backward(on);
}

void Gpt::backward_part(int mb, int c, float dloss, ConstPtr output_grad, Ptr input_grad,
                        BackwardPart part, bool last) {
    const bool weights = part != BackwardPart::input;
    // The gradients this backward adds are reduced now: after the chunk's last backward of
    // the step, or after every one when sharded gradients are reduced per microbatch.
    const bool reduce =
        weights && (last || (options_.sharding.grads && options_.sharding.every_microbatch));
    Set& set = store_.live(mb, c);
    const Ptr d_residual = scratch_[parts_.d_residual];
    if (has_head(c))
        head_backward(c, set, dloss, part, reduce);
    else if (part != BackwardPart::weight)
        ops_.copy(d_residual, output_grad, boundary_size());
    for (int i = layout_.chunk_layers(c) - 1; i >= 0; --i) layer_backward(c, set, i, part, reduce);
    if (embeds(c))
        embedding_backward(set, part, reduce);
    else if (part != BackwardPart::weight)
        ops_.copy(input_grad, d_residual, boundary_size());
    if (weights) store_.release(mb, c);
}

void Gpt::head_backward(int c, Set& set, float dloss, BackwardPart part, bool reduce) {
    const SetBuffers own = store_.own(set);
    const Pass pass{own, set.training, set.seed, shape().layers};
    const bool reads_params = reads_params_in(part);
    if (reads_params) {
        params_needed(lnf_range());
        params_needed(wte_range());
        params_prefetch(next_in_backward(c, layout_.chunk_layers(c)));
    }
    if (part != BackwardPart::input && !frozen()) {
        grads_needed(lnf_range());
        grads_needed(wte_range());
    }
    const ConstPtr x = chunk_output(c, set);
    if (part == BackwardPart::weight)
        parts_.head->backward_weight(ctx_, pass, x);
    else
        parts_.head->backward(ctx_, pass, x, dloss, scratch_[parts_.d_residual], part);
    if (reads_params) {
        params_done(lnf_range());
        params_done(wte_range());
    }
    if (!reduce || frozen()) return;
    parts_.head->finish_grads(ctx_);
    grads_final(lnf_range());
    // Sharded, the tied copies are summed on the shards after the reduction; a stage that
    // also embeds announces wte with the embedding (under ZB-V, after the head's last W: a
    // stage's W's run in the order of their B's).
    if (options_.sharding.grads && !layout_.plan().first() && shape().tied)
        grads_final(wte_range());
}

void Gpt::layer_backward(int c, Set& set, int i, BackwardPart part, bool reduce) {
    const int l = layout_.first_layer(c) + i;
    const TransformerLayer& layer_l = parts_.layer(c, i);
    const SetBuffers buffers = store_.layer(set, c, i);
    const Pass pass{buffers, set.training, set.seed, l};
    const ConstPtr x = layer_input(c, set, i);
    const bool reads_params = reads_params_in(part);
    if (reads_params) {
        params_needed(layout_.layer_range(l));
        params_prefetch(next_in_backward(c, i));
    }
    if (part != BackwardPart::input)
        grads_needed(frozen() ? lora_layout_.layer_range(l) : layout_.layer_range(l));
    // Full recompute: rerun the layer's forward from its kept input (its collectives too, in
    // the same order on every tensor rank), just before its backward (before its W too).
    if (options_.recompute == Recompute::full) layer_l.forward(ctx_, pass, x, Ptr());
    if (part == BackwardPart::weight)
        layer_l.backward_weight(ctx_, pass, x);
    else
        layer_l.backward(ctx_, pass, x, scratch_[parts_.d_residual], part,
                         options_.recompute == Recompute::selective);
    if (reads_params) params_done(layout_.layer_range(l));
    if (!reduce) return;
    layer_l.finish_grads(ctx_);
    grads_final(frozen() ? lora_layout_.layer_range(l) : layout_.layer_range(l));
}

void Gpt::embedding_backward(Set& set, BackwardPart part, bool reduce) {
    const SetBuffers own = store_.own(set);
    const Pass pass{own, set.training, set.seed, -1};
    if (part != BackwardPart::input && !frozen()) grads_needed(embedding_range());
    if (part == BackwardPart::weight)
        parts_.embedding->backward_weight(ctx_, pass);
    else
        parts_.embedding->backward(ctx_, pass, scratch_[parts_.d_residual], part);
    if (!reduce || frozen()) return;
    // Unsharded, wte's other copy (on the last stage of a pipeline) is added by the trainer,
    // which announces it (StepHooks).
    const Range range = embedding_range();
    const bool whole = layout_.plan().stages == 1 || options_.sharding.grads || !shape().tied;
    if (whole)
        grads_final(range);
    else if (layout_.wpe() != kNoParam)
        grads_final({layout_.wpe(), range.second});
}

void Gpt::zero_grads() {
    weights_.grads.zero();
    weights_.lora_grads.zero();
}

// ---- the data-parallel hooks -----------------------------------------------------------------

bool Gpt::reads_params_in(BackwardPart part) const {
    // A weight gradient is the product of the saved input and the kept output gradient (and
    // a norm's, of its saved statistics): only full recompute's rerun forward reads weights,
    // and a low-rank adapter's dA, which reads its B (model/lora_adapter.h).
    return part != BackwardPart::weight || options_.recompute == Recompute::full || frozen();
}

// A frozen model's own parameters go to the frozen_* hooks, its adapters' (those of the
// layers in the range) to the others.
void Gpt::params_needed(Range r) const {
    if (!frozen()) return call(hooks_.params_needed, r);
    call(hooks_.frozen_needed, r);
    call(hooks_.params_needed, adapters_of(r));
}

void Gpt::params_prefetch(Range r) const {
    if (!frozen()) return call(hooks_.params_prefetch, r);
    call(hooks_.frozen_prefetch, r);
    call(hooks_.params_prefetch, adapters_of(r));
}

void Gpt::params_done(Range r) const {
    if (!frozen()) return call(hooks_.params_done, r);
    call(hooks_.frozen_done, r);
    call(hooks_.params_done, adapters_of(r));
}

Gpt::Range Gpt::adapters_of(Range r) const {
    Range adapters{0, 0};
    for (int c = 0; c < layout_.plan().chunks; ++c)
        for (int l = layout_.first_layer(c); l < layout_.first_layer(c) + layout_.chunk_layers(c);
             ++l) {
            const Range layer = layout_.layer_range(l);
            if (layer.first < r.first || r.second < layer.second) continue;
            const Range mine = lora_layout_.layer_range(l);
            adapters = adapters.first < adapters.second
                           ? Range{std::min(adapters.first, mine.first),
                                   std::max(adapters.second, mine.second)}
                           : mine;
        }
    return adapters;
}

void Gpt::grads_needed(Range r) const {
    if (hooks_.grads_needed && r.first < r.second) hooks_.grads_needed(r.first, r.second);
}

void Gpt::grads_final(Range r) const {
    if (hooks_.grads_final && r.first < r.second) hooks_.grads_final(r.first, r.second);
}

Gpt::Range Gpt::embedding_range() const {
    return layout_.embedding_range();
}

Gpt::Range Gpt::lnf_range() const {
    return layout_.head_range();
}

Gpt::Range Gpt::wte_range() const {
    if (!shape().tied) return {0, 0};  // the head's weight is its own, in lnf_range
    return {layout_.wte(), layout_.wte() + static_cast<std::size_t>(layout_.vocab_local()) *
                                               static_cast<std::size_t>(layout_.shape().hidden)};
}

Gpt::Range Gpt::next_in_forward(int c, int i) const {
    if (i + 1 < layout_.chunk_layers(c)) return layout_.layer_range(layout_.first_layer(c) + i + 1);
    if (has_head(c)) return lnf_range();
    return {0, 0};
}

Gpt::Range Gpt::next_in_backward(int c, int i) const {
    if (i > 0) return layout_.layer_range(layout_.first_layer(c) + i - 1);
    return {0, 0};  // the embedding's backward reads no parameters
}

}  // namespace trident::model
