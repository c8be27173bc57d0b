// The GPT model on one rank: its chunks' forward and backward, and the events on its units
// around each part (see model/gpt.h).
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

// A sharded buffer's units: the layout's, each cut where a run of the experts held begins and
// ends (that run a unit of its own, over the expert-data ranks).
struct ShardedUnits {
    std::vector<FlatBuffer::Range> ranges;
    std::vector<UnitShards> shards;
};

ShardedUnits sharded_units(const ParamLayout& layout, const BufferPlan& plan) {
    const UnitShards group{static_cast<int>(plan.multiple), plan.replica, false};
    const UnitShards experts{static_cast<int>(plan.expert_multiple), plan.expert_replica, true};
    const auto& runs = layout.expert_runs();
    ShardedUnits out;
    const auto add = [&](std::size_t begin, std::size_t end, const UnitShards& shards) {
        if (begin == end) return;
        out.ranges.emplace_back(begin, end);
        out.shards.push_back(shards);
    };
    auto run = runs.begin();
    for (auto [begin, end] : layout.unit_ranges()) {
        for (; run != runs.end() && run->first < end; ++run) {
            add(begin, run->first, group);
            add(run->first, run->second, experts);
            begin = run->second;
        }
        add(begin, end, group);
    }
    return out;
}

// The flat buffers as the plan holds them: whole (padded to its multiple), or sharded by the
// layout's units (sharded_units). A frozen model has no gradients: its adapters have, in
// buffers of their own, held alike.
Weights make_weights(kernels::Ops& ops, const GptOptions& o, const ParamLayout& layout,
                     const ParamLayout& lora_layout) {
    const BufferPlan& plan = o.buffers;
    const std::size_t multiple = plan.multiple;
    const auto buffer = [&](const ParamLayout& of, bool sharded, kernels::DType dtype,
                            std::vector<FlatBuffer::Range> gaps = {}) {
        if (!sharded)
            return FlatBuffer(ops, round_up(of.total(), multiple), dtype, std::move(gaps));
        ShardedUnits units = sharded_units(of, plan);
        return FlatBuffer(ops, std::move(units.ranges), std::move(units.shards), dtype,
                          std::move(gaps));
    };
    Weights w;
    w.frozen = o.lora.shape.rank > 0;
    // A 4-bit base's matrices are its codes (model/nf4_base.h), not the buffer's: gaps in it,
    // whole or sharded (ZeRO-3 then gathers their codes, not dequantized weights).
    w.params =
        buffer(layout, plan.shard_params, o.precision.params,
               o.lora.quant_block ? quantized_ranges(layout) : std::vector<FlatBuffer::Range>{});
    w.grads = w.frozen ? FlatBuffer(ops, 0, o.precision.grads)
                       : buffer(layout, plan.shard_grads, o.precision.grads);
    if (!w.frozen) return w;
    w.lora_params = buffer(lora_layout, plan.shard_params, o.precision.params);
    w.lora_grads = buffer(lora_layout, plan.shard_grads, o.precision.grads);
    return w;
}

// The units of the layout: their ranges in the trainable buffer (a frozen model's: its
// adapters', by the layer's name), in the frozen model's own and in a 4-bit base's bytes.
std::vector<ModelUnit> make_units(const ParamLayout& layout, const ParamLayout& lora_layout,
                                  bool frozen, const Nf4Base* nf4) {
    std::vector<ModelUnit> units;
    for (const Unit& u : layout.units()) {
        ModelUnit m{u.name, {u.begin, u.end}, {0, 0}, {0, 0}, false};
        if (nf4) m.codes = nf4->codes_of({u.begin, u.end});
        if (frozen) {
            m.frozen = m.trainable;
            m.trainable = {0, 0};
            for (const Unit& a : lora_layout.units())
                if (a.name == u.name) m.trainable = {a.begin, a.end};
        }
        units.push_back(std::move(m));
    }
    return units;
}

// The index of the unit holding element `offset` of the layout.
std::size_t unit_at(const ParamLayout& layout, std::size_t offset) {
    const std::vector<Unit>& units = layout.units();
    for (std::size_t u = 0; u < units.size(); ++u)
        if (offset >= units[u].begin && offset < units[u].end) return u;
    throw Error("internal: no unit holds element " + std::to_string(offset));
}

// Sharded gradients split each unit, and a ZeRO-1 step the runs of the experts held (their
// own buckets, model/param_layout.h), evenly over the ranks.
int unit_align(const BufferPlan& plan, const StagePlan& stage) {
    return plan.shard_grads || stage.experts > 1 ? static_cast<int>(plan.multiple) : 1;
}

// Where the activations go: recompute's, a split backward's, and an attention's W deferred to
// the next MoE layer's exchange (only where the backward is not split: there W runs apart).
KeepPolicy keep_policy(const GptOptions& o) {
    return KeepPolicy{o.recompute, o.split_backward, o.ep_overlap && !o.split_backward};
}

Dims dims_of(const GptOptions& o, const ModelGroups& groups) {
    return make_dims(o.shape, DimsInputs{o.micro_batch, groups.tensor.size(), groups.tensor.rank(),
                                         groups.context.size(), o.sequence_parallel, o.tp_overlap,
                                         o.context_mode, o.precision.activations,
                                         groups.experts ? groups.experts->size() : 1});
}

}  // namespace

Gpt::Gpt(kernels::Ops& ops, const GptOptions& options, const ModelGroups& groups)
    : ops_(ops),
      options_(options),
      layout_(options.shape, groups.tensor.rank(), groups.tensor.size(), options.plan,
              unit_align(options.buffers, options.plan)),
      lora_layout_(ParamLayout::for_lora(options.shape, options.lora.shape, groups.tensor.rank(),
                                         groups.tensor.size(), options.plan,
                                         unit_align(options.buffers, options.plan))),
      d_(dims_of(options, groups)),
      rows_(ops, groups.tensor, d_,
            context_positions(options.shape.max_seq, groups.context.size(), groups.context.rank())),
      weights_(make_weights(ops, options, layout_, lora_layout_)),
      own_(layout_, ParamLayout(options.shape), weights_.params, weights_.grads),
      adapters_(lora_layout_, ParamLayout::for_lora(options.shape, options.lora.shape),
                weights_.lora_params, weights_.lora_grads),
      nf4_(options.lora.quant_block
               ? std::make_unique<Nf4Base>(ops, layout_, d_.tensor_rank, options.lora.quant_block,
                                           options.lora.double_quant, options.buffers)
               : nullptr),
      parts_(build_stage(layout_, lora_layout_, d_,
                         PartOptions{options.dropout,
                                     options.lora,
                                     [&ops](int B, int heads, int T, kernels::DType act) {
                                         return ops.attention_saved(B, heads, T, act);
                                     },
                                     {},
                                     nf4_.get(),
                                     options.documents.mask})),
      scratch_(ops, parts_.scratch.buffers()),
      ctx_{ops,      rows_,        groups.context, groups.kv_replicas, weights_,
           scratch_, &moe_losses_, groups.experts, &deferred_},
      store_(ops, keep_policy(options), parts_.chunks),
      loss_sum_(ops, 1, kernels::DType::f64),
      units_(make_units(layout_, lora_layout_, weights_.frozen, nf4_.get())) {
    const StagePlan& plan = layout_.plan();
    const bool tied = layout_.shape().tied;
    const auto [begin, end] = layout_.embedding_range();
    for (Unit u = 0; u < units_.size() && plan.first(); ++u)
        if (layout_.units()[u].begin >= begin && layout_.units()[u].begin < end)
            embedding_units_.push_back(u);
    if (plan.first() || (plan.last() && tied)) wte_unit_ = unit_at(layout_, layout_.wte());
    if (plan.last()) head_unit_ = unit_at(layout_, layout_.head_range().first);
    // A pipeline's tied embedding: the first stage's copy and the last's.
    if (wte_unit_ != kNone) units_[wte_unit_].shared = tied && plan.first() != plan.last();
    if (parts_.positions >= 0) {
        const std::vector<int32_t> positions =
            context_positions(options.shape.max_seq, groups.context.size(), groups.context.rank());
        ops.upload(scratch_[parts_.positions].data, positions.data(),
                   positions.size() * sizeof(int32_t));
    }
}

void Gpt::quantize_base(const std::vector<float>& whole) {
    if (!nf4_) throw Error("internal: quantize_base without a 4-bit base");
    nf4_->quantize(own_.whole(), whole, options_.precision.params);
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
    const Pass pass = pass_of(set, previous, layout_.first_layer(c) + i - 1);
    return parts_.layer(c, i - 1).output(pass);
}

ConstPtr Gpt::chunk_output(int c, const Set& set) const {
    return layer_input(c, set, layout_.chunk_layers(c));
}

Pass Gpt::pass_of(const Set& set, const SetBuffers& buffers, int layer) const {
    return Pass{buffers, set.training, set.seed, layer,
                options_.documents.any() ? &set.documents : nullptr};
}

void Gpt::find_documents(int c, Set& set, const int32_t* inputs) {
    const DocumentOptions& o = options_.documents;
    if (!o.any()) return;
    const int slot = parts_.chunk_documents[static_cast<std::size_t>(c)];
    auto* device = slot < 0
                       ? nullptr
                       : static_cast<int32_t*>(set.own[static_cast<std::size_t>(slot)].data().data);
    if (d_.C == 1 || !o.mask) return set.documents.find(ops_, o, inputs, d_.B, d_.T, device);
    // Under context parallelism the attention sees whole windows: their tokens from the
    // context group, each rank's at the window positions it holds (model/context_split.h).
    const std::size_t B = static_cast<std::size_t>(d_.B), T = static_cast<std::size_t>(d_.T),
                      S = static_cast<std::size_t>(d_.seq_len);
    std::vector<int32_t> gathered(B * S), whole(B * S);
    ctx_.context.all_gather(inputs, gathered.data(), B * T);
    for (int r = 0; r < d_.C; ++r) {
        const std::vector<int32_t> held = context_positions(d_.seq_len, d_.C, r);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t)
                whole[b * S + static_cast<std::size_t>(held[t])] =
                    gathered[(static_cast<std::size_t>(r) * B + b) * T + t];
    }
    set.documents.find_split(ops_, o, whole.data(), inputs, d_.B, d_.seq_len,
                             context_positions(d_.seq_len, d_.C, ctx_.context.rank()), device);
}

// ---- forward ---------------------------------------------------------------------------------

void Gpt::forward_chunk(int mb, int c, const int32_t* inputs, const int32_t* targets,
                        ConstPtr input, Ptr output, bool training, uint64_t dropout_seed) {
    Set& set = store_.start(mb, c);
    set.training = training;
    set.seed = dropout_seed;
    find_documents(c, set, inputs);
    run_forward(c, set, inputs, input);
    if (has_head(c)) {
        const SetBuffers own = store_.own(set);
        const Pass pass = pass_of(set, own, layout_.shape().layers);
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
    const Pass own_pass = pass_of(set, own, -1);
    const Ptr x = chunk_input(c, set);
    if (embeds(c)) {
        for (std::size_t i = 0; i < embedding_units_.size(); ++i)
            params_needed(embedding_units_[i],
                          i + 1 == embedding_units_.size() ? next_in_forward(c, -1) : kNone);
        parts_.embedding->forward(ctx_, own_pass, inputs, x);
        // A tied wte is the head's too: the head lets it go.
        if (!has_head(c) || !layout_.shape().tied)
            for (Unit u : embedding_units_) params_done(u);
    } else {
        ops_.copy(x, input, boundary_size());
    }
    const int first = layout_.first_layer(c);
    for (int i = 0; i < layout_.chunk_layers(c); ++i) {
        const SetBuffers buffers = store_.layer(set, c, i);
        const Pass pass = pass_of(set, buffers, first + i);
        params_needed(layer_unit(first + i), next_in_forward(c, i));
        const TransformerLayer& layer = parts_.layer(c, i);
        layer.forward(ctx_, pass, layer_input(c, set, i), layer.output(pass));
        params_done(layer_unit(first + i));
    }
    if (!has_head(c)) return;
    head_needed(kNone);
    parts_.head->forward(ctx_, own_pass, chunk_output(c, set));
    head_done();
}

std::vector<float> Gpt::logits_at(const int32_t* inputs, int position) {
    const StagePlan& plan = layout_.plan();
    if (layout_.M() != 1 || plan.stages != 1 || plan.chunks != 1 || d_.C != 1)
        throw Error("generation runs on one process (parallel.tensor = pipeline = context = 1)");
    const GptShape& s = layout_.shape();
    Set& set = store_.start(0, 0);
    set.training = false;
    find_documents(0, set, inputs);
    run_forward(0, set, inputs, nullptr);
    std::vector<float> row(static_cast<std::size_t>(s.vocab));  // padded columns dropped
    const SetBuffers own = store_.own(set);
    const Pass pass = pass_of(set, own, s.layers);
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
    if (!options_.split_backward)
        throw Error("internal: a split backward on a model not set up for it");
    backward_part(mb, c, dloss, output_grad, input_grad, BackwardPart::input, false);
}

void Gpt::backward_weight(int mb, int c, bool last) {
    backward_part(mb, c, 0.0f, {}, {}, BackwardPart::weight, last);
}

void Gpt::backward_part(int mb, int c, float dloss, ConstPtr output_grad, Ptr input_grad,
                        BackwardPart part, bool last) {
    const bool weights = part != BackwardPart::input;
    // The gradients this backward adds are reduced now: after the chunk's last backward of
    // the step, or after every one when sharded gradients are reduced per microbatch.
    const bool reduce = weights && (last || options_.buffers.grads_every_microbatch);
    Set& set = store_.live(mb, c);
    const Ptr d_residual = scratch_[parts_.d_residual];
    if (has_head(c))
        head_backward(c, set, dloss, part, reduce);
    else if (part != BackwardPart::weight)
        ops_.copy(d_residual, output_grad, boundary_size());
    for (int i = layout_.chunk_layers(c) - 1; i >= 0; --i)
        layer_backward(c, set, i, dloss, part, reduce);
    deferred_.run();  // none left: each waits for the layer below, which runs it
    if (embeds(c))
        embedding_backward(set, part, reduce);
    else if (part != BackwardPart::weight)
        ops_.copy(input_grad, d_residual, boundary_size());
    if (weights) store_.release(mb, c);
}

void Gpt::head_backward(int c, Set& set, float dloss, BackwardPart part, bool reduce) {
    const SetBuffers own = store_.own(set);
    const Pass pass = pass_of(set, own, layout_.shape().layers);
    const bool reads_params = reads_params_in(part);
    const bool tied = layout_.shape().tied;
    if (reads_params) head_needed(next_in_backward(c, layout_.chunk_layers(c)));
    if (part != BackwardPart::input) {
        grads_needed(head_unit_);
        if (tied) grads_needed(wte_unit_);
    }
    const ConstPtr x = chunk_output(c, set);
    if (part == BackwardPart::weight)
        parts_.head->backward_weight(ctx_, pass, x);
    else
        parts_.head->backward(ctx_, pass, x, dloss, scratch_[parts_.d_residual], part);
    if (reads_params) head_done();
    if (!reduce || frozen()) return;
    parts_.head->finish_grads(ctx_);
    grads_complete(head_unit_);
    // A stage that also embeds announces the tied wte with the embedding (under ZB-V, after
    // the head's last W: a stage's W's run in the order of their B's).
    if (tied && !layout_.plan().first()) grads_complete(wte_unit_);
}

void Gpt::layer_backward(int c, Set& set, int i, float dloss, BackwardPart part, bool reduce) {
    const int l = layout_.first_layer(c) + i;
    const TransformerLayer& layer_l = parts_.layer(c, i);
    const SetBuffers buffers = store_.layer(set, c, i);
    Pass pass = pass_of(set, buffers, l);
    pass.dloss = dloss;
    const ConstPtr x = layer_input(c, set, i);
    const bool reads_params = reads_params_in(part);
    if (reads_params) params_needed(layer_unit(l), next_in_backward(c, i));
    if (part != BackwardPart::input) grads_needed(layer_unit(l));
    // Full recompute: rerun the layer's forward from its kept input (its collectives too, in
    // the same order on every tensor rank), just before its backward (before its W too).
    if (options_.recompute == Recompute::full) layer_l.forward(ctx_, pass, x, Ptr());
    const bool defer = defers_attention(c, i, part);
    if (part == BackwardPart::weight)
        layer_l.backward_weight(ctx_, pass, x);
    else
        layer_l.backward(ctx_, pass, x, scratch_[parts_.d_residual], part,
                         options_.recompute == Recompute::selective, defer);
    if (reads_params) params_done(layer_unit(l));
    if (defer) return defer_attention(c, set, i, reduce);
    if (reduce) layer_grads_done(c, i);
}

bool Gpt::defers_attention(int c, int i, BackwardPart part) const {
    return options_.ep_overlap && part == BackwardPart::both && i > 0 &&
           parts_.layer(c, i - 1).exchanges();
}

void Gpt::defer_attention(int c, Set& set, int i, bool reduce) {
    // The set's buffers, what B kept for the attention's W among them (the shared scratch's,
    // which the layer below reads and writes nothing of before its dispatch), are the
    // layer's until this runs.
    deferred_.set([this, c, &set, i, reduce, buffers = store_.layer(set, c, i)] {
        const Pass pass = pass_of(set, buffers, layout_.first_layer(c) + i);
        parts_.layer(c, i).attention_weights(ctx_, pass);
        if (reduce) layer_grads_done(c, i);
    });
}

void Gpt::layer_grads_done(int c, int i) {
    parts_.layer(c, i).finish_grads(ctx_);
    grads_complete(layer_unit(layout_.first_layer(c) + i));
}

void Gpt::embedding_backward(Set& set, BackwardPart part, bool reduce) {
    const SetBuffers own = store_.own(set);
    const Pass pass = pass_of(set, own, -1);
    if (part != BackwardPart::input)
        for (Unit u : embedding_units_) grads_needed(u);
    if (part == BackwardPart::weight)
        parts_.embedding->backward_weight(ctx_, pass);
    else
        parts_.embedding->backward(ctx_, pass, scratch_[parts_.d_residual], part);
    if (!reduce || frozen()) return;
    for (Unit u : embedding_units_) grads_complete(u);
}

// ---- the units' events -----------------------------------------------------------------------

bool Gpt::reads_params_in(BackwardPart part) const {
    // A weight gradient is the product of the saved input and the kept output gradient (and
    // a norm's, of its saved statistics): only full recompute's rerun forward reads weights,
    // and a low-rank adapter's dA, which reads its B (model/lora_adapter.h).
    return part != BackwardPart::weight || options_.recompute == Recompute::full || frozen();
}

void Gpt::params_needed(Unit u, Unit next) const {
    if (listener_ && u != kNone) listener_->params_needed(u, next == kNone ? nullptr : &next);
}

void Gpt::params_done(Unit u) const {
    if (listener_ && u != kNone) listener_->params_done(u);
}

void Gpt::grads_needed(Unit u) const {
    if (listener_ && u != kNone) listener_->grads_needed(u);
}

void Gpt::grads_complete(Unit u) const {
    if (listener_ && u != kNone) listener_->grads_complete(u);
}

void Gpt::head_needed(Unit next) const {
    if (!layout_.shape().tied) return params_needed(head_unit_, next);
    params_needed(head_unit_);
    params_needed(wte_unit_, next);
}

void Gpt::head_done() const {
    params_done(head_unit_);
    if (layout_.shape().tied) params_done(wte_unit_);
}

Gpt::Unit Gpt::layer_unit(int l) const {
    return unit_at(layout_, layout_.layer_range(l).first);
}

Gpt::Unit Gpt::next_in_forward(int c, int i) const {
    if (i + 1 < layout_.chunk_layers(c)) return layer_unit(layout_.first_layer(c) + i + 1);
    if (has_head(c)) return head_unit_;
    return kNone;
}

Gpt::Unit Gpt::next_in_backward(int c, int i) const {
    if (i > 0) return layer_unit(layout_.first_layer(c) + i - 1);
    return kNone;  // the embedding's backward reads no parameters
}

}  // namespace trident::model
