// GPT-2 forward and backward per (microbatch, chunk), tensor- and pipeline-parallel
// (see model/gpt.h).
#include "model/gpt.h"

#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "error.h"
#include "kernels/random.h"
#include "model/context_split.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

// ---- Gpt -------------------------------------------------------------------------------------

namespace {

// Token ids live in i32 device buffers.
const int32_t* as_tokens(const DeviceBuffer& b) {
    return static_cast<const int32_t*>(b.data().data);
}

void upload_tokens(kernels::Ops& ops, DeviceBuffer& dst, const int32_t* host, std::size_t n) {
    ops.upload(dst.data().data, host, n * sizeof(int32_t));
}

// A flat buffer on the host as its layout lays it out (without the padding).
std::vector<float> host_copy(const FlatBuffer& buffer, const ParamLayout& layout) {
    std::vector<float> host = buffer.to_host();
    host.resize(layout.total());
    return host;
}

}  // namespace

// ---- activations of one (microbatch, chunk) -----------------------------------------------

// Under recompute a set allocates only what it keeps; the rest stay empty buffers.
struct Gpt::LayerActivations {
    DeviceBuffer ln1, ln1_mean, ln1_rstd;  // (R,C), (R), (R): R = this rank's rows
    DeviceBuffer ln1_all;                  // (N,C) all rows of ln1 (sequence parallel)
    DeviceBuffer qkv;                      // (N,3C/M)
    DeviceBuffer att;                      // what attention keeps: (B,NH/M,T,T) on the CPU
    DeviceBuffer atty;                     // (N,C/M)
    DeviceBuffer atty_heads;               // (N,C/M) the head-split output (Ulysses)
    DeviceBuffer resid2;                   // (R,C)
    DeviceBuffer ln2, ln2_mean, ln2_rstd;  // (R,C), (R), (R)
    DeviceBuffer ln2_all;                  // (N,C) (sequence parallel)
    DeviceBuffer fch, fch_gelu;            // (N,F/M), (N,F/M)
    DeviceBuffer resid3;                   // (R,C), the next layer's input
    // A split backward's B keeps for its W the gradients of the outputs of the layer's four
    // linears and two LayerNorms (allocated only when the backward is split).
    DeviceBuffer d_fc2, d_fc1;   // (N,C), (N,F/M)
    DeviceBuffer d_ln2;          // (R,C)
    DeviceBuffer d_proj, d_qkv;  // (N,C), (N,3C/M)
    DeviceBuffer d_ln1;          // (R,C)
    // Each adapter's h = s·drop(x)·A^T (N,r), by AdapterTarget (adapters only).
    std::array<DeviceBuffer, kAdapterTargets> adapter_h;
};

struct Gpt::Activations {
    bool training = false;
    uint64_t dropout_seed = 0;
    DeviceBuffer inputs, targets;  // (B,T) token ids, i32
    DeviceBuffer embedded;         // (N,C) partial sums of the lookup (sequence parallel)
    DeviceBuffer input;            // (R,C) the chunk's input: embedding or received
    std::vector<LayerActivations> layers;
    // The head (last global chunk).
    DeviceBuffer lnf, lnf_mean, lnf_rstd;  // (R,C), (R), (R)
    DeviceBuffer lnf_all;                  // (N,C) (sequence parallel)
    DeviceBuffer logits;                   // (N,Vp/M), turned into dlogits by backward
    DeviceBuffer loss_stats;   // (4,N): row max | global max | sum of exps | target logit
    DeviceBuffer lse, losses;  // (N), (N)
    // A split backward's B keeps for its W: the final LayerNorm's output gradient (the
    // dlogits stay in `logits`) and the embedding's (R,C) each.
    DeviceBuffer d_lnf, d_embed;
};

Gpt::Gpt(kernels::Ops& ops, const GptShape& shape, int micro_batch, float dropout,
         parallel::Comm* tensor, bool sequence_parallel, const StagePlan& plan,
         std::size_t buffer_multiple, Recompute recompute, const Precision& precision,
         const Sharding& sharding, const ContextSplit& context, const Adapters& adapters)
    : ops_(ops),
      tensor_(tensor ? *tensor : solo_),
      sequence_parallel_(sequence_parallel && tensor_.size() > 1),
      layout_(shape, tensor_.rank(), tensor_.size(), plan,
              sharding.grads ? static_cast<int>(buffer_multiple) : 1),
      B_(micro_batch),
      T_(shape.max_seq / (context.group ? context.group->size() : 1)),
      rows_(micro_batch * T_),
      rows_mine_(sequence_parallel_ ? rows_ / tensor_.size() : rows_),
      dropout_(dropout),
      recompute_(recompute),
      precision_(precision),
      sharding_(sharding),
      adapters_(adapters),
      adapter_layout_(
          ParamLayout::adapters(shape, adapters.shape, tensor_.rank(), tensor_.size(), plan)),
      pool_(static_cast<std::size_t>(plan.chunks)) {
    if (sequence_parallel_ && rows_ % tensor_.size() != 0)
        throw Error("sequence parallelism splits the micro batch's B*T = " + std::to_string(rows_) +
                    " rows over parallel.tensor = " + std::to_string(tensor_.size()) +
                    " ranks: they must divide");
    const std::size_t N = static_cast<std::size_t>(rows_), R = static_cast<std::size_t>(rows_mine_);
    const std::size_t C = shape.hidden, Cm = layout_.hidden_local(), Fm = layout_.ffn_local();
    const kernels::DType act = precision.activations;

    // This rank's residual rows in the whole microbatch: its tokens' positions, and under
    // sequence parallelism its share [tp·R, (tp+1)·R) of the local rows; and all its rows.
    const int ranks = context.group ? context.group->size() : 1;
    const int rank = context.group ? context.group->rank() : 0;
    const std::vector<int32_t> positions = context_positions(shape.max_seq, ranks, rank);
    const auto runs_of = [&](std::size_t first, std::size_t count) {
        std::vector<RowRun> runs;
        for (std::size_t row = first; row < first + count; ++row) {
            const std::size_t whole =
                row / static_cast<std::size_t>(T_) * static_cast<std::size_t>(shape.max_seq) +
                static_cast<std::size_t>(positions[row % static_cast<std::size_t>(T_)]);
            if (!runs.empty() && runs.back().whole + runs.back().rows == whole)
                ++runs.back().rows;
            else
                runs.push_back({row - first, whole, 1});
        }
        return runs;
    };
    residual_runs_ =
        runs_of(sequence_parallel_ ? static_cast<std::size_t>(tensor_.rank()) * R : 0, R);
    all_runs_ = runs_of(0, N);
    if (ranks > 1) {
        const ContextShape attention{B_,
                                     shape.max_seq,
                                     layout_.hidden_local(),
                                     layout_.heads_local(),
                                     layout_.heads_begin(),
                                     shape.heads};
        context_ =
            std::make_unique<ContextAttention>(ops, *context.group, context.mode, attention, act);
        positions_ = DeviceBuffer(ops, static_cast<std::size_t>(T_), kernels::DType::i32);
        ops.upload(positions_.data().data, positions.data(), positions.size() * sizeof(int32_t));
    }

    const std::size_t padded =
        (layout_.total() + buffer_multiple - 1) / buffer_multiple * buffer_multiple;
    const int replicas = static_cast<int>(buffer_multiple);
    params_ = sharding.params
                  ? FlatBuffer(ops, layout_.units(), replicas, sharding.replica, precision.params)
                  : FlatBuffer(ops, padded, precision.params);
    // A frozen model has no gradients: its adapters have (padded like the parameters).
    grads_ = frozen() ? FlatBuffer(ops, 0, precision.grads)
             : sharding.grads
                 ? FlatBuffer(ops, layout_.units(), replicas, sharding.replica, precision.grads)
                 : FlatBuffer(ops, padded, precision.grads);
    if (frozen()) {
        if (sharding.grads)
            throw Error("internal: low-rank adapters with sharded gradients (ZeRO-2 or 3)");
        const std::size_t adapters_padded =
            (adapter_layout_.total() + buffer_multiple - 1) / buffer_multiple * buffer_multiple;
        adapter_params_ = FlatBuffer(ops, adapters_padded, precision.params);
        adapter_grads_ = FlatBuffer(ops, adapters_padded, precision.grads);
        const std::size_t r = static_cast<std::size_t>(adapters.shape.rank);
        adapter_x_ = DeviceBuffer(ops, N * std::max(C, Fm), act);
        adapter_y_ = DeviceBuffer(ops, N * std::max({3 * Cm, Fm, C}), act);
        adapter_g_ = DeviceBuffer(ops, N * r, act);
    }
    proj_partial_ = DeviceBuffer(ops, N * C, act);
    loss_sum_ = DeviceBuffer(ops, 1, kernels::DType::f64);
    proj_reduced_ = DeviceBuffer(ops, sequence_parallel_ ? R * C : 0, act);
    dresidual_ = DeviceBuffer(ops, R * C, act);
    dc_a_ = DeviceBuffer(ops, N * C, act);
    dc_b_ = DeviceBuffer(ops, N * C, act);
    dc_mine_ = DeviceBuffer(ops, R * C, act);
    dc_all_ = DeviceBuffer(ops, sequence_parallel_ ? N * C : 0, act);
    df_a_ = DeviceBuffer(ops, N * Fm, act);
    df_b_ = DeviceBuffer(ops, N * Fm, act);
    dqkv_ = DeviceBuffer(ops, N * 3 * Cm, act);
    if (recompute_ != Recompute::none) {
        recompute_scratch_ = std::make_unique<LayerActivations>();
        allocate_layer(*recompute_scratch_, recompute_ == Recompute::full, !keeps_attention(),
                       false);
    }
}

Gpt::~Gpt() = default;

void Gpt::allocate_layer(LayerActivations& l, bool work, bool att, bool output) {
    const std::size_t N = static_cast<std::size_t>(rows_), R = static_cast<std::size_t>(rows_mine_);
    const std::size_t C = layout_.shape().hidden, Cm = layout_.hidden_local(),
                      Fm = layout_.ffn_local();
    const std::size_t all_rows = sequence_parallel_ ? N * C : 0;
    kernels::Ops& ops = ops_;
    const kernels::DType act = precision_.activations;
    if (work) {
        l.ln1 = DeviceBuffer(ops, R * C, act);
        l.ln1_mean = DeviceBuffer(ops, R);
        l.ln1_rstd = DeviceBuffer(ops, R);
        l.ln1_all = DeviceBuffer(ops, all_rows, act);
        l.qkv = DeviceBuffer(ops, N * 3 * Cm, act);
        l.atty = DeviceBuffer(ops, N * Cm, act);
        l.resid2 = DeviceBuffer(ops, R * C, act);
        l.ln2 = DeviceBuffer(ops, R * C, act);
        l.ln2_mean = DeviceBuffer(ops, R);
        l.ln2_rstd = DeviceBuffer(ops, R);
        l.ln2_all = DeviceBuffer(ops, all_rows, act);
        l.fch = DeviceBuffer(ops, N * Fm, act);
        l.fch_gelu = DeviceBuffer(ops, N * Fm, act);
        for (int t = 0; t < kAdapterTargets; ++t)
            if (adapters_.shape.targets[static_cast<std::size_t>(t)])
                l.adapter_h[static_cast<std::size_t>(t)] =
                    DeviceBuffer(ops, N * static_cast<std::size_t>(adapters_.shape.rank), act);
    }
    if (work && context_ && context_->keeps_out_heads())
        l.atty_heads = DeviceBuffer(ops, N * Cm, act);
    if (att) {
        const kernels::Ops::AttentionSaved saved =
            context_ ? kernels::Ops::AttentionSaved{context_->saved_count(), context_->saved_type()}
                     : ops.attention_saved(B_, layout_.heads_local(), T_, act);
        l.att = DeviceBuffer(ops, saved.count, saved.dtype);
    }
    if (output) l.resid3 = DeviceBuffer(ops, R * C, act);
}

std::unique_ptr<Gpt::Activations> Gpt::new_activations(int c) {
    const GptShape& s = layout_.shape();
    const StagePlan& plan = layout_.plan();
    const int g = plan.global_chunk(c);
    const bool embeds = g == 0, head = g == plan.stages * plan.chunks - 1;
    const std::size_t N = static_cast<std::size_t>(rows_), R = static_cast<std::size_t>(rows_mine_);
    const std::size_t C = s.hidden;
    const std::size_t all_rows = sequence_parallel_ ? N * C : 0;
    kernels::Ops& ops = ops_;
    const kernels::DType act = precision_.activations;
    const std::size_t allocated_before = ops.allocated_bytes();

    auto a = std::make_unique<Activations>();
    a->inputs = DeviceBuffer(ops, embeds ? N : 0, kernels::DType::i32);
    a->targets = DeviceBuffer(ops, head ? N : 0, kernels::DType::i32);
    a->embedded = DeviceBuffer(ops, embeds ? all_rows : 0, act);
    a->input = DeviceBuffer(ops, R * C, act);
    a->layers.resize(static_cast<std::size_t>(layout_.chunk_layers(c)));
    // Each layer keeps its output (the next one's input) and, unless recomputed, what its
    // backward reads.
    for (auto& l : a->layers) {
        allocate_layer(l, recompute_ != Recompute::full, keeps_attention(), true);
        if (split_backward_) {
            const std::size_t Fm = layout_.ffn_local(), Cm = layout_.hidden_local();
            l.d_fc2 = DeviceBuffer(ops, N * C, act);
            l.d_fc1 = DeviceBuffer(ops, N * Fm, act);
            l.d_ln2 = DeviceBuffer(ops, R * C, act);
            l.d_proj = DeviceBuffer(ops, N * C, act);
            l.d_qkv = DeviceBuffer(ops, N * 3 * Cm, act);
            l.d_ln1 = DeviceBuffer(ops, R * C, act);
        }
    }
    if (split_backward_) {
        a->d_lnf = DeviceBuffer(ops, head ? R * C : 0, act);
        a->d_embed = DeviceBuffer(ops, embeds ? R * C : 0, act);
    }
    if (head) {
        a->lnf = DeviceBuffer(ops, R * C, act);
        a->lnf_mean = DeviceBuffer(ops, R);
        a->lnf_rstd = DeviceBuffer(ops, R);
        a->lnf_all = DeviceBuffer(ops, all_rows, act);
        a->logits = DeviceBuffer(ops, N * layout_.vocab_local(), act);
        a->loss_stats = DeviceBuffer(ops, 4 * N);
        a->lse = DeviceBuffer(ops, N);
        a->losses = DeviceBuffer(ops, N);
    }
    activation_bytes_ += ops.allocated_bytes() - allocated_before;
    return a;
}

Gpt::Activations& Gpt::start(int mb, int c) {
    auto& pool = pool_[static_cast<std::size_t>(c)];
    std::unique_ptr<Activations> a;
    if (pool.empty()) {
        a = new_activations(c);
    } else {
        a = std::move(pool.back());
        pool.pop_back();
    }
    auto [it, fresh] = live_.emplace(std::pair{mb, c}, std::move(a));
    if (!fresh)
        throw Error("internal: microbatch " + std::to_string(mb) + " of chunk " +
                    std::to_string(c) + " is already in flight");
    return *it->second;
}

Gpt::Activations& Gpt::live(int mb, int c) {
    const auto it = live_.find({mb, c});
    if (it == live_.end())
        throw Error("internal: no forward of microbatch " + std::to_string(mb) + " on chunk " +
                    std::to_string(c) + " to run backward on");
    return *it->second;
}

std::size_t Gpt::activation_sets() const {
    std::size_t n = live_.size();
    for (const auto& pool : pool_) n += pool.size();
    return n;
}

void Gpt::release(int mb, int c) {
    const auto it = live_.find({mb, c});
    pool_[static_cast<std::size_t>(c)].push_back(std::move(it->second));
    live_.erase(it);
}

// ---- parameters ------------------------------------------------------------------------------

void Gpt::init_random(uint64_t seed, float init_std) {
    const ParamLayout full_layout(layout_.shape());
    const GptShape& s = full_layout.shape();
    const double residual_std = init_std / std::sqrt(2.0 * s.layers);
    std::vector<float> full(full_layout.total(), 0.0f);
    const auto& tensors = full_layout.tensors();
    for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
        const ParamTensor& t = tensors[ti];
        float* p = full.data() + t.offset;
        const auto ends_with = [&](const char* suffix) {
            const std::size_t n = std::strlen(suffix);
            return t.name.size() >= n && t.name.compare(t.name.size() - n, n, suffix) == 0;
        };
        if (t.shape.size() == 1) {  // biases 0, LayerNorm gains 1
            const bool gain =
                ends_with("ln_1.weight") || ends_with("ln_2.weight") || t.name == "ln_f.weight";
            for (std::size_t i = 0; i < t.numel; ++i) p[i] = gain ? 1.0f : 0.0f;
            continue;
        }
        const bool residual_out = ends_with("attn.c_proj.weight") || ends_with("mlp.c_proj.weight");
        const double stddev = residual_out ? residual_std : init_std;
        // Padded vocabulary rows of wte stay zero: they never take part in the loss.
        std::size_t count = t.numel;
        if (t.offset == full_layout.wte()) count = static_cast<std::size_t>(s.vocab) * s.hidden;
        const uint64_t tensor_seed = kernels::hash64(seed, ti);
        for (std::size_t i = 0; i < count; ++i)
            p[i] = static_cast<float>(stddev * kernels::normal(tensor_seed, i));
    }
    load_full_params(full);
}

void Gpt::load_params(const std::vector<float>& local) {
    params_.from_host(local);
}

void Gpt::load_full_params(const std::vector<float>& full) {
    std::vector<float> local(layout_.total());
    shard_params(ParamLayout(layout_.shape()), full.data(), layout_, local.data());
    load_params(local);
}

std::vector<float> Gpt::params_to_host() const {
    return host_copy(params_, layout_);
}

std::vector<float> Gpt::grads_to_host() const {
    return host_copy(grads_, layout_);
}

std::vector<float> Gpt::adapters_to_host() const {
    return host_copy(adapter_params_, adapter_layout_);
}

std::vector<float> Gpt::adapter_grads_to_host() const {
    return host_copy(adapter_grads_, adapter_layout_);
}

void Gpt::load_adapters(const std::vector<float>& local) {
    adapter_params_.from_host(local);
}

void Gpt::load_full_adapters(const std::vector<float>& full) {
    std::vector<float> local(adapter_layout_.total());
    shard_params(ParamLayout::adapters(shape(), adapters_.shape), full.data(), adapter_layout_,
                 local.data());
    load_adapters(local);
}

std::vector<float> Gpt::share_of_full(const std::vector<float>& local) const {
    return share_of_whole(layout_, local, ParamLayout(layout_.shape()));
}

std::vector<float> Gpt::adapter_share_of_full(const std::vector<float>& local) const {
    return share_of_whole(adapter_layout_, local, ParamLayout::adapters(shape(), adapters_.shape));
}

void Gpt::zero_grads() {
    grads_.zero();
    adapter_grads_.zero();
}

std::pair<std::size_t, std::size_t> Gpt::embedding_range() const {
    return {layout_.wte(), layout_.wpe() + static_cast<std::size_t>(layout_.shape().max_seq) *
                                               layout_.shape().hidden};
}

std::pair<std::size_t, std::size_t> Gpt::lnf_range() const {
    return {layout_.lnf_w(), layout_.lnf_b() + static_cast<std::size_t>(layout_.shape().hidden)};
}

std::pair<std::size_t, std::size_t> Gpt::wte_range() const {
    return {layout_.wte(), layout_.wte() + static_cast<std::size_t>(layout_.vocab_local()) *
                                               layout_.shape().hidden};
}

std::pair<std::size_t, std::size_t> Gpt::next_in_forward(int c, int i) const {
    const StagePlan& plan = layout_.plan();
    if (i + 1 < layout_.chunk_layers(c)) return layout_.layer_range(layout_.first_layer(c) + i + 1);
    if (plan.global_chunk(c) == plan.stages * plan.chunks - 1) return lnf_range();
    return {0, 0};
}

std::pair<std::size_t, std::size_t> Gpt::next_in_backward(int c, int i) const {
    if (i > 0) return layout_.layer_range(layout_.first_layer(c) + i - 1);
    return {0, 0};  // the embedding's backward reads no parameters
}

// ---- collectives of the tensor group ---------------------------------------------------------

uint64_t Gpt::site_seed(const Activations& a, int layer, int site) const {
    return kernels::hash64(a.dropout_seed, static_cast<uint64_t>(layer + 1) * 4 + site);
}

Gpt::AdapterDropout Gpt::adapter_dropout(const Activations& a, int l, AdapterTarget t) const {
    // Site 3 of a layer is its adapters'.
    return {a.training ? adapters_.dropout : 0.0f,
            kernels::hash64(site_seed(a, l, 3), static_cast<uint64_t>(t))};
}

ConstPtr Gpt::all_rows(ConstPtr mine, Ptr all) {
    if (!sequence_parallel_) return mine;
    tensor_.all_gather(mine, all, static_cast<std::size_t>(rows_mine_) * layout_.shape().hidden);
    return all;
}

Ptr Gpt::reduce_rows(Ptr partial, Ptr mine) {
    const std::size_t C = layout_.shape().hidden;
    if (!sequence_parallel_) {
        tensor_.all_reduce(partial, static_cast<std::size_t>(rows_) * C);
        return partial;
    }
    tensor_.reduce_scatter(partial, mine, static_cast<std::size_t>(rows_mine_) * C);
    return mine;
}

// ---- forward ---------------------------------------------------------------------------------

void Gpt::forward_chunk(int mb, int c, const int32_t* inputs, const int32_t* targets,
                        ConstPtr input, Ptr output, bool training, uint64_t dropout_seed) {
    const StagePlan& plan = layout_.plan();
    const bool head = plan.global_chunk(c) == plan.stages * plan.chunks - 1;
    Activations& a = start(mb, c);
    a.training = training;
    a.dropout_seed = dropout_seed;
    run_forward(c, a, inputs, input);
    if (head) {
        loss(a, targets);
    } else {
        const ConstPtr last = a.layers.empty() ? a.input.data() : a.layers.back().resid3.data();
        ops_.copy(output, last, boundary_size());
    }
    if (!training) release(mb, c);
}

double Gpt::take_loss_sum() {
    double sum = 0.0;
    ops_.download(&sum, loss_sum_.data().data, sizeof(sum));
    ops_.zero(loss_sum_.data(), 1);
    return sum;
}

void Gpt::run_forward(int c, Activations& a, const int32_t* inputs, ConstPtr input) {
    const GptShape& s = layout_.shape();
    const int B = B_, T = T_, C = s.hidden, R = rows_mine_, N = rows_;
    const float drop = a.training ? dropout_ : 0.0f;
    const StagePlan& plan = layout_.plan();
    const int g = plan.global_chunk(c);
    const bool head = g == plan.stages * plan.chunks - 1;
    const FlatBuffer::Base w = params_.base();

    if (g == 0) {
        const auto [embedding_begin, embedding_end] = embedding_range();
        params_needed(embedding_begin, embedding_end);
        const auto [next_begin, next_end] = next_in_forward(c, -1);
        params_prefetch(next_begin, next_end);
        // Vocab-parallel embedding: each rank looks up the tokens of its vocabulary slice
        // (zero rows for the rest) and the sum over the group is the embedding; wpe is added
        // once, by tensor rank 0, so the sum is exact.
        upload_tokens(ops_, a.inputs, inputs, static_cast<std::size_t>(N));
        const Ptr embedded = sequence_parallel_ ? a.embedded.data() : a.input.data();
        ops_.embedding_forward(embedded, as_tokens(a.inputs), w + layout_.wte(),
                               tensor_.rank() == 0 ? w + layout_.wpe() : nullptr, B, T, C,
                               layout_.vocab_begin(), layout_.vocab_local(), positions(),
                               s.max_seq);
        const Ptr encoded = reduce_rows(embedded, a.input.data());
        dropout_rows(encoded, drop, site_seed(a, -1, 0));
        if (!head) params_done(embedding_begin, embedding_end);  // else wte is the head's too
    } else {
        ops_.copy(a.input.data(), input, static_cast<std::size_t>(R) * C);
    }

    ConstPtr residual = a.input.data();  // (R,C)
    const int first = layout_.first_layer(c);
    for (std::size_t i = 0; i < a.layers.size(); ++i) {
        LayerActivations& kept = a.layers[i];
        // Under full recompute the intermediates go to the scratch (backward rebuilds them);
        // att too, unless the layer keeps it (keeps_attention).
        LayerActivations& la = recompute_ == Recompute::full ? *recompute_scratch_ : kept;
        const Ptr att = keeps_attention() ? kept.att.data() : recompute_scratch_->att.data();
        const auto [begin, end] = layout_.layer_range(first + static_cast<int>(i));
        params_needed(begin, end);
        const auto [next_begin, next_end] = next_in_forward(c, static_cast<int>(i));
        params_prefetch(next_begin, next_end);
        forward_layer(a, first + static_cast<int>(i), la, att, residual, kept.resid3.data());
        params_done(begin, end);
        residual = kept.resid3.data();
    }

    if (!head) return;
    const auto [lnf_begin, lnf_end] = lnf_range();
    const auto [wte_begin, wte_end] = wte_range();
    params_needed(lnf_begin, lnf_end);
    params_needed(wte_begin, wte_end);
    ops_.layernorm_forward(a.lnf.data(), a.lnf_mean.f32(), a.lnf_rstd.f32(), residual,
                           w + layout_.lnf_w(), w + layout_.lnf_b(), R, C);
    // LM head tied to this rank's slice of the token embedding: logits (N,Vp/M).
    const ConstPtr lnf = all_rows(a.lnf.data(), a.lnf_all.data());
    ops_.matmul_forward(a.logits.data(), lnf, w + layout_.wte(), nullptr, N, C,
                        layout_.vocab_local());
    params_done(lnf_begin, lnf_end);
    params_done(wte_begin, wte_end);
}

void Gpt::forward_layer(const Activations& a, int l, LayerActivations& la, Ptr att,
                        ConstPtr residual, Ptr output) {
    const GptShape& s = layout_.shape();
    const int B = B_, T = T_, C = s.hidden, R = rows_mine_, N = rows_;
    const int Cm = layout_.hidden_local(), Fm = layout_.ffn_local(), NHm = layout_.heads_local();
    const std::size_t RC = static_cast<std::size_t>(R) * C;
    const float drop = a.training ? dropout_ : 0.0f;
    const FlatBuffer::Base w = params_.base();
    const LayerParams& p = layout_.layer(l);
    // A linear's adapter, if it has one: h from its input x (down), h·B^T added to its
    // output y (up).
    const auto down = [&](AdapterTarget t, ConstPtr x) {
        if (adapters_.shape.has(t))
            adapter_down(adapter_dropout(a, l, t), l, t, x,
                         la.adapter_h[static_cast<std::size_t>(t)].data());
    };
    const auto up = [&](AdapterTarget t, Ptr y) {
        if (adapters_.shape.has(t))
            adapter_up(l, t, la.adapter_h[static_cast<std::size_t>(t)].data(), y);
    };

    // Attention: LN -> f -> column-parallel qkv -> this rank's heads -> row-parallel
    // proj -> g -> bias -> dropout -> residual.
    ops_.layernorm_forward(la.ln1.data(), la.ln1_mean.f32(), la.ln1_rstd.f32(), residual,
                           w + p.ln1_w, w + p.ln1_b, R, C);
    const ConstPtr ln1 = all_rows(la.ln1.data(), la.ln1_all.data());
    // Context parallelism: attention over the whole sequence, split over the context group,
    // from the q, k, v it takes where it wants them.
    const Ptr qkv = context_ ? context_->qkv_input(la.qkv.data()) : la.qkv.data();
    ops_.matmul_forward(qkv, ln1, w + p.qkv_w, w + p.qkv_b, N, C, 3 * Cm);
    down(AdapterTarget::qkv, ln1);
    up(AdapterTarget::qkv, qkv);
    if (context_)
        context_->forward(la.atty.data(), la.qkv.data(), la.atty_heads.data(), att, drop,
                          site_seed(a, l, 0));
    else
        ops_.attention_forward(la.atty.data(), att, la.qkv.data(), B, T, Cm, NHm, drop,
                               site_seed(a, l, 0), layout_.heads_begin(), s.heads);
    ops_.matmul_forward(proj_partial_.data(), la.atty.data(), w + p.proj_w, nullptr, N, Cm, C);
    down(AdapterTarget::attn_proj, la.atty.data());
    up(AdapterTarget::attn_proj, proj_partial_.data());
    const Ptr attproj = reduce_rows(proj_partial_.data(), proj_reduced_.data());
    ops_.add_bias(attproj, w + p.proj_b, R, C);
    dropout_rows(attproj, drop, site_seed(a, l, 1));
    ops_.residual_forward(la.resid2.data(), residual, attproj, RC);

    // MLP: LN -> f -> column-parallel fc1 -> GELU -> row-parallel fc2 -> g -> bias ->
    // dropout -> residual.
    ops_.layernorm_forward(la.ln2.data(), la.ln2_mean.f32(), la.ln2_rstd.f32(), la.resid2.data(),
                           w + p.ln2_w, w + p.ln2_b, R, C);
    const ConstPtr ln2 = all_rows(la.ln2.data(), la.ln2_all.data());
    ops_.matmul_forward(la.fch.data(), ln2, w + p.fc1_w, w + p.fc1_b, N, C, Fm);
    down(AdapterTarget::fc, ln2);
    up(AdapterTarget::fc, la.fch.data());
    ops_.gelu_forward(la.fch_gelu.data(), la.fch.data(), static_cast<std::size_t>(N) * Fm);
    down(AdapterTarget::fc_proj, la.fch_gelu.data());  // backward reads its h, output or not
    if (!output) return;  // recompute: fc2's output is the kept one, not needed again
    ops_.matmul_forward(proj_partial_.data(), la.fch_gelu.data(), w + p.fc2_w, nullptr, N, Fm, C);
    up(AdapterTarget::fc_proj, proj_partial_.data());
    const Ptr fcproj = reduce_rows(proj_partial_.data(), proj_reduced_.data());
    ops_.add_bias(fcproj, w + p.fc2_b, R, C);
    dropout_rows(fcproj, drop, site_seed(a, l, 2));
    ops_.residual_forward(output, la.resid2.data(), fcproj, RC);
}

void Gpt::loss(Activations& a, const int32_t* targets) {
    const GptShape& s = layout_.shape();
    const int N = rows_;
    upload_tokens(ops_, a.targets, targets, static_cast<std::size_t>(N));
    // Vocab-parallel cross-entropy: three numbers per row cross the tensor group, never the
    // logits. loss_stats = row max | global max | sum of exps | target logit, each (N).
    float* row_max = a.loss_stats.f32();
    float* global_max = row_max + N;
    float* sums = global_max + N;  // sum of exps and target logit, reduced in one call
    float* target_logit = sums + N;
    ops_.cross_entropy_partials(row_max, sums, target_logit, a.logits.data(), as_tokens(a.targets),
                                N, layout_.vocab_begin(), s.vocab, layout_.vocab_local());
    ops_.copy(global_max, row_max, static_cast<std::size_t>(N));
    tensor_.all_reduce(global_max, static_cast<std::size_t>(N), parallel::ReduceOp::max);
    ops_.cross_entropy_rescale(sums, row_max, global_max, N);
    tensor_.all_reduce(sums, 2 * static_cast<std::size_t>(N));
    ops_.cross_entropy_losses(a.losses.f32(), a.lse.f32(), global_max, sums, target_logit, N);
    ops_.add_mean(static_cast<double*>(loss_sum_.data().data), a.losses.f32(), N);
}

std::vector<float> Gpt::logits_at(const int32_t* inputs, int position) {
    const StagePlan& plan = layout_.plan();
    if (layout_.tensor_size() != 1 || plan.stages != 1 || plan.chunks != 1 || context_)
        throw Error("generation runs on one process (parallel.tensor = pipeline = context = 1)");
    const GptShape& s = layout_.shape();
    Activations& a = start(0, 0);
    a.training = false;
    run_forward(0, a, inputs, nullptr);
    std::vector<float> row(static_cast<std::size_t>(s.vocab));  // padded columns dropped
    ops_.copy_to_host(row.data(),
                      a.logits.data() + static_cast<std::size_t>(position) * s.padded_vocab,
                      row.size());
    release(0, 0);
    return row;
}

// ---- backward --------------------------------------------------------------------------------

void Gpt::dropout_rows(Ptr x, float drop, uint64_t seed) {
    if (drop == 0) return;
    const std::size_t C = static_cast<std::size_t>(layout_.shape().hidden);
    for (const RowRun& run : residual_runs_)
        ops_.dropout_forward(x + run.local * C, x + run.local * C, run.rows * C, drop, seed,
                             run.whole * C);
}

ConstPtr Gpt::through_dropout(ConstPtr dout, std::size_t count, float drop, uint64_t seed) {
    if (drop == 0) return dout;
    const std::size_t C = static_cast<std::size_t>(layout_.shape().hidden);
    ops_.zero(dc_mine_.data(), count);
    for (const RowRun& run : residual_runs_)
        ops_.dropout_backward(dc_mine_.data() + run.local * C, dout + run.local * C, run.rows * C,
                              drop, seed, run.whole * C);
    return dc_mine_.data();
}

void Gpt::backward_chunk(int mb, int c, float dloss, ConstPtr output_grad, Ptr input_grad,
                         bool last) {
    backward_part(mb, c, dloss, output_grad, input_grad, Part::both, last);
}

void Gpt::backward_input(int mb, int c, float dloss, ConstPtr output_grad, Ptr input_grad) {
    if (!split_backward_) throw Error("internal: a split backward on a model not set up for it");
    backward_part(mb, c, dloss, output_grad, input_grad, Part::input, false);
}

void Gpt::backward_weight(int mb, int c, bool last) {
    backward_part(mb, c, 0.0f, {}, {}, Part::weight, last);
}

void Gpt::set_split_backward(bool on) {
    if (activation_sets() > 0) throw Error("internal: the backward split after a forward");
    split_backward_ = on;
}

void Gpt::backward_part(int mb, int c, float dloss, ConstPtr output_grad, Ptr input_grad, Part part,
                        bool last) {
    const StagePlan& plan = layout_.plan();
    const int g = plan.global_chunk(c);
    const std::size_t C = layout_.shape().hidden;
    const std::size_t RC = static_cast<std::size_t>(rows_mine_) * C;
    const bool weights = part != Part::input;
    // The gradients this backward adds are reduced now: after the chunk's last backward of
    // the step, or after every one when sharded gradients are reduced per microbatch.
    const bool reduce = weights && (last || (sharding_.grads && sharding_.every_microbatch));
    // The model's own gradients (none when frozen: only its layers' adapters have).
    const bool model_grads = weights && !frozen();
    Activations& a = live(mb, c);
    const int layers = static_cast<int>(a.layers.size());

    // dresidual holds the gradient of this rank's rows of the residual stream (R,C); each
    // layer's branches add into it, from the last layer back.
    if (g == plan.stages * plan.chunks - 1) {
        const auto [lnf_begin, lnf_end] = lnf_range();
        const auto [wte_begin, wte_end] = wte_range();
        params_needed(lnf_begin, lnf_end);
        params_needed(wte_begin, wte_end);
        const auto [next_begin, next_end] = next_in_backward(c, layers);
        params_prefetch(next_begin, next_end);
        if (model_grads) {
            grads_needed(lnf_begin, lnf_end);
            grads_needed(wte_begin, wte_end);
        }
        head_backward(a, dloss, part);
        params_done(lnf_begin, lnf_end);
        params_done(wte_begin, wte_end);
        if (reduce && !frozen()) {
            gradients_final(lnf_begin, lnf_end, {layout_.lnf_w(), layout_.lnf_b()});
            // Sharded, the tied copies are summed on the shards after the reduction; a
            // chunk that also embeds announces wte with the embedding.
            if (sharding_.grads && g != 0) gradients_final(wte_begin, wte_end, {});
        }
    } else if (part != Part::weight) {
        ops_.copy(dresidual_.data(), output_grad, RC);
    }
    const int first = layout_.first_layer(c);
    for (int i = layers - 1; i >= 0; --i) {
        const ConstPtr residual =
            i == 0 ? a.input.data() : a.layers[static_cast<std::size_t>(i - 1)].resid3.data();
        const auto [begin, end] = layout_.layer_range(first + i);
        params_needed(begin, end);
        const auto [next_begin, next_end] = next_in_backward(c, i);
        params_prefetch(next_begin, next_end);
        if (model_grads) grads_needed(begin, end);
        backward_layer(a, first + i, a.layers[static_cast<std::size_t>(i)], residual, part);
        params_done(begin, end);
        if (reduce && frozen()) {
            adapter_gradients_final(first + i);
        } else if (reduce) {
            const LayerParams& p = layout_.layer(first + i);
            gradients_final(begin, end, {p.ln1_w, p.ln1_b, p.ln2_w, p.ln2_b});
        }
    }
    if (g == 0) {
        const auto [embedding_begin, embedding_end] = embedding_range();
        if (model_grads) grads_needed(embedding_begin, embedding_end);
        embedding_backward(a, part);
        // Unsharded, wte's other copy (on the last stage of a pipeline) is added by the
        // trainer, which announces it (StepHooks).
        if (reduce && !frozen())
            gradients_final(plan.stages == 1 || sharding_.grads ? embedding_begin : layout_.wpe(),
                            embedding_end, {});
    } else if (part != Part::weight) {
        ops_.copy(input_grad, dresidual_.data(), RC);
    }
    if (weights) release(mb, c);
}

void Gpt::head_backward(Activations& a, float dloss, Part part) {
    const GptShape& s = layout_.shape();
    const int C = s.hidden, R = rows_mine_, N = rows_;
    const FlatBuffer::Base w = params_.base();
    const FlatBuffer::Base grad = grads_.base();
    const bool inputs = part != Part::weight, weights = part != Part::input && !frozen();
    const ConstPtr lnf = sequence_parallel_ ? a.lnf_all.data() : a.lnf.data();
    const ConstPtr last = a.layers.empty() ? a.input.data() : a.layers.back().resid3.data();
    const Ptr dwte = weights ? grad + layout_.wte() : Ptr();
    const Ptr dlnf_w = weights ? grad + layout_.lnf_w() : Ptr();
    const Ptr dlnf_b = weights ? grad + layout_.lnf_b() : Ptr();
    if (!inputs) {  // W: from the dlogits (kept in logits) and the stashed dlnf
        if (frozen()) return;
        ops_.matmul_backward(nullptr, dwte, nullptr, a.logits.data(), lnf, w + layout_.wte(), N, C,
                             layout_.vocab_local());
        ops_.layernorm_backward(nullptr, dlnf_w, dlnf_b, a.d_lnf.data(), last, w + layout_.lnf_w(),
                                a.lnf_mean.f32(), a.lnf_rstd.f32(), R, C);
        return;
    }
    // Loss and LM head. dlogits overwrite the logits; the gradient into the head's input is
    // this rank's vocabulary share (f: all-reduce, or reduce-scatter to its rows).
    ops_.cross_entropy_backward(a.logits.data(), a.logits.data(), a.lse.f32(), as_tokens(a.targets),
                                dloss, N, layout_.vocab_begin(), s.vocab, layout_.vocab_local());
    ops_.zero(dc_a_.data(), static_cast<std::size_t>(N) * C);
    ops_.matmul_backward(dc_a_.data(), dwte, nullptr, a.logits.data(), lnf, w + layout_.wte(), N, C,
                         layout_.vocab_local());
    const ConstPtr dlnf = reduce_rows(dc_a_.data(), dc_mine_.data());
    if (part == Part::input) ops_.copy(a.d_lnf.data(), dlnf, static_cast<std::size_t>(R) * C);
    ops_.zero(dresidual_.data(), static_cast<std::size_t>(R) * C);
    ops_.layernorm_backward(dresidual_.data(), dlnf_w, dlnf_b, dlnf, last, w + layout_.lnf_w(),
                            a.lnf_mean.f32(), a.lnf_rstd.f32(), R, C);
}

void Gpt::backward_layer(const Activations& a, int l, LayerActivations& kept, ConstPtr residual,
                         Part part) {
    const GptShape& s = layout_.shape();
    const int B = B_, T = T_, C = s.hidden, R = rows_mine_, N = rows_;
    const int Cm = layout_.hidden_local(), Fm = layout_.ffn_local(), NHm = layout_.heads_local();
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    const std::size_t RC = static_cast<std::size_t>(R) * C;
    const std::size_t NFm = static_cast<std::size_t>(N) * Fm;
    const std::size_t NCm = static_cast<std::size_t>(N) * Cm;
    const float drop = a.training ? dropout_ : 0.0f;
    const FlatBuffer::Base w = params_.base();
    const LayerParams& p = layout_.layer(l);
    const bool inputs = part != Part::weight, weights = part != Part::input;
    // The parameters' gradients, where this part computes them (none when frozen).
    const auto grad = [&](std::size_t offset) {
        return weights && !frozen() ? grads_.at(offset) : Ptr();
    };

    LayerActivations& la = recompute_ == Recompute::full ? *recompute_scratch_ : kept;
    // Full recompute: rerun the layer's forward from its kept input (its collectives too, in
    // the same order on every tensor rank), just before its backward (before its W too).
    if (recompute_ == Recompute::full) forward_layer(a, l, la, la.att.data(), residual, nullptr);
    const Ptr att = keeps_attention() ? kept.att.data() : recompute_scratch_->att.data();
    const ConstPtr ln1 = sequence_parallel_ ? la.ln1_all.data() : la.ln1.data();
    const ConstPtr ln2 = sequence_parallel_ ? la.ln2_all.data() : la.ln2.data();
    // A linear's adapter, if it has one, from the gradient dy of the linear's output and its
    // input x, adding into dx (this part's share).
    const auto adapter = [&](AdapterTarget t, ConstPtr x, ConstPtr dy, Ptr dx) {
        if (adapters_.shape.has(t))
            adapter_backward(adapter_dropout(a, l, t), l, t, x, dy, dx,
                             la.adapter_h[static_cast<std::size_t>(t)].data(), part);
    };

    if (!inputs) {  // W: every parameter gradient from the output gradients B kept
        adapter(AdapterTarget::fc_proj, la.fch_gelu.data(), kept.d_fc2.data(), {});
        adapter(AdapterTarget::fc, ln2, kept.d_fc1.data(), {});
        adapter(AdapterTarget::attn_proj, la.atty.data(), kept.d_proj.data(), {});
        adapter(AdapterTarget::qkv, ln1, kept.d_qkv.data(), {});
        if (frozen()) return;
        ops_.matmul_backward(nullptr, grad(p.fc2_w), grad(p.fc2_b), kept.d_fc2.data(),
                             la.fch_gelu.data(), w + p.fc2_w, N, Fm, C);
        ops_.matmul_backward(nullptr, grad(p.fc1_w), grad(p.fc1_b), kept.d_fc1.data(), ln2,
                             w + p.fc1_w, N, C, Fm);
        ops_.layernorm_backward(nullptr, grad(p.ln2_w), grad(p.ln2_b), kept.d_ln2.data(),
                                la.resid2.data(), w + p.ln2_w, la.ln2_mean.f32(), la.ln2_rstd.f32(),
                                R, C);
        ops_.matmul_backward(nullptr, grad(p.proj_w), grad(p.proj_b), kept.d_proj.data(),
                             la.atty.data(), w + p.proj_w, N, Cm, C);
        ops_.matmul_backward(nullptr, grad(p.qkv_w), grad(p.qkv_b), kept.d_qkv.data(), ln1,
                             w + p.qkv_w, N, C, 3 * Cm);
        ops_.layernorm_backward(nullptr, grad(p.ln1_w), grad(p.ln1_b), kept.d_ln1.data(), residual,
                                w + p.ln1_w, la.ln1_mean.f32(), la.ln1_rstd.f32(), R, C);
        return;
    }
    // B alone keeps each output gradient for its W.
    const auto keep = [&](DeviceBuffer& stash, ConstPtr value, std::size_t count) {
        if (!weights) ops_.copy(stash.data(), value, count);
    };

    // MLP branch. g backward: the gradient of fc2's output is the residual's (all rows).
    const ConstPtr dfcproj =
        all_rows(through_dropout(dresidual_.data(), RC, drop, site_seed(a, l, 2)), dc_all_.data());
    keep(kept.d_fc2, dfcproj, NC);
    ops_.zero(df_a_.data(), NFm);
    ops_.matmul_backward(df_a_.data(), grad(p.fc2_w), grad(p.fc2_b), dfcproj, la.fch_gelu.data(),
                         w + p.fc2_w, N, Fm, C);
    adapter(AdapterTarget::fc_proj, la.fch_gelu.data(), dfcproj, df_a_.data());
    ops_.zero(df_b_.data(), NFm);
    ops_.gelu_backward(df_b_.data(), la.fch.data(), df_a_.data(), NFm);
    keep(kept.d_fc1, df_b_.data(), NFm);
    ops_.zero(dc_a_.data(), NC);
    ops_.matmul_backward(dc_a_.data(), grad(p.fc1_w), grad(p.fc1_b), df_b_.data(), ln2, w + p.fc1_w,
                         N, C, Fm);
    adapter(AdapterTarget::fc, ln2, df_b_.data(), dc_a_.data());
    const ConstPtr dln2 = reduce_rows(dc_a_.data(), dc_mine_.data());  // f backward
    keep(kept.d_ln2, dln2, RC);
    ops_.layernorm_backward(dresidual_.data(), grad(p.ln2_w), grad(p.ln2_b), dln2, la.resid2.data(),
                            w + p.ln2_w, la.ln2_mean.f32(), la.ln2_rstd.f32(), R, C);

    // Attention branch.
    const ConstPtr dattproj =
        all_rows(through_dropout(dresidual_.data(), RC, drop, site_seed(a, l, 1)), dc_all_.data());
    keep(kept.d_proj, dattproj, NC);
    ops_.zero(dc_b_.data(), NCm);
    ops_.matmul_backward(dc_b_.data(), grad(p.proj_w), grad(p.proj_b), dattproj, la.atty.data(),
                         w + p.proj_w, N, Cm, C);
    adapter(AdapterTarget::attn_proj, la.atty.data(), dattproj, dc_b_.data());
    ops_.zero(dqkv_.data(), 3 * NCm);
    if (context_) {
        if (recompute_ == Recompute::selective) context_->rebuild(att, la.qkv.data(), drop);
        context_->backward(dqkv_.data(), dc_b_.data(), la.qkv.data(), la.atty.data(),
                           la.atty_heads.data(), att, drop, site_seed(a, l, 0));
    } else {
        if (recompute_ == Recompute::selective)  // what attention keeps, rebuilt from qkv
            ops_.attention_rebuild(att, la.qkv.data(), B, T, Cm, NHm, drop);
        ops_.attention_backward(dqkv_.data(), dc_b_.data(), la.qkv.data(), la.atty.data(), att, B,
                                T, Cm, NHm, drop, site_seed(a, l, 0), layout_.heads_begin(),
                                s.heads);
    }
    keep(kept.d_qkv, dqkv_.data(), 3 * NCm);
    ops_.zero(dc_a_.data(), NC);
    ops_.matmul_backward(dc_a_.data(), grad(p.qkv_w), grad(p.qkv_b), dqkv_.data(), ln1, w + p.qkv_w,
                         N, C, 3 * Cm);
    adapter(AdapterTarget::qkv, ln1, dqkv_.data(), dc_a_.data());
    const ConstPtr dln1 = reduce_rows(dc_a_.data(), dc_mine_.data());  // f backward
    keep(kept.d_ln1, dln1, RC);
    ops_.layernorm_backward(dresidual_.data(), grad(p.ln1_w), grad(p.ln1_b), dln1, residual,
                            w + p.ln1_w, la.ln1_mean.f32(), la.ln1_rstd.f32(), R, C);
}

void Gpt::embedding_backward(Activations& a, Part part) {
    if (frozen()) return;  // no gradient to compute, and no input to pass one on to
    const int C = layout_.shape().hidden;
    const std::size_t RC = static_cast<std::size_t>(rows_mine_) * C;
    if (part == Part::input) {  // no input gradient here: W takes it from the stash
        ops_.copy(a.d_embed.data(), dresidual_.data(), RC);
        return;
    }
    const float drop = a.training ? dropout_ : 0.0f;
    const ConstPtr dresidual = part == Part::weight ? a.d_embed.data() : dresidual_.data();
    // The embedding's reduction backward: every rank scatters all rows into its slice.
    const ConstPtr dencoded =
        all_rows(through_dropout(dresidual, RC, drop, site_seed(a, -1, 0)), dc_all_.data());
    ops_.embedding_backward(grads_.at(layout_.wte()), grads_.at(layout_.wpe()), dencoded,
                            as_tokens(a.inputs), B_, T_, C, layout_.vocab_begin(),
                            layout_.vocab_local(), positions(), layout_.shape().max_seq);
}

void Gpt::gradients_final(std::size_t begin, std::size_t end,
                          std::initializer_list<std::size_t> layernorm_offsets) {
    if (sequence_parallel_)
        for (const std::size_t offset : layernorm_offsets)
            tensor_.all_reduce(grads_.at(offset), static_cast<std::size_t>(layout_.shape().hidden));
    if (hooks_.grads_final) hooks_.grads_final(begin, end);
}

}  // namespace trident::model
