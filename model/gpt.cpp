// GPT-2 forward and backward for one microbatch, tensor-parallel (see model/gpt.h).
#include "model/gpt.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "error.h"
#include "kernels/random.h"

namespace trident::model {

// ---- DeviceBuffer ----------------------------------------------------------------------------

DeviceBuffer::DeviceBuffer(kernels::Ops& ops, std::size_t count)
    : ops_(&ops), data_(ops.allocate(count)), count_(count) {}

DeviceBuffer::~DeviceBuffer() {
    if (data_) ops_->release(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ops_(other.ops_), data_(std::exchange(other.data_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        if (data_) ops_->release(data_);
        ops_ = other.ops_;
        data_ = std::exchange(other.data_, nullptr);
        count_ = std::exchange(other.count_, 0);
    }
    return *this;
}

// ---- Gpt -------------------------------------------------------------------------------------

namespace {

// Token ids are int32 stored in float-sized device slots: one allocator serves both.
const int32_t* as_tokens(const DeviceBuffer& b) { return reinterpret_cast<const int32_t*>(b.data()); }

void upload_tokens(kernels::Ops& ops, DeviceBuffer& dst, const int32_t* host, std::size_t n) {
    static_assert(sizeof(int32_t) == sizeof(float));
    ops.copy_from_host(dst.data(), reinterpret_cast<const float*>(host), n);
}

}  // namespace

Gpt::Gpt(kernels::Ops& ops, const GptShape& shape, int micro_batch, float dropout,
         parallel::Comm* tensor, bool sequence_parallel)
    : ops_(ops),
      tensor_(tensor ? *tensor : solo_),
      sequence_parallel_(sequence_parallel && tensor_.size() > 1),
      layout_(shape, tensor_.rank(), tensor_.size()),
      B_(micro_batch),
      T_(shape.max_seq),
      rows_(micro_batch * shape.max_seq),
      rows_mine_(sequence_parallel_ ? rows_ / tensor_.size() : rows_),
      first_element_(sequence_parallel_
                         ? static_cast<uint64_t>(tensor_.rank()) * rows_mine_ * shape.hidden
                         : 0),
      dropout_(dropout) {
    if (sequence_parallel_ && rows_ % tensor_.size() != 0)
        throw Error("sequence parallelism splits the micro batch's B*T = " + std::to_string(rows_) +
                    " rows over parallel.tensor = " + std::to_string(tensor_.size()) +
                    " ranks: they must divide");
    const std::size_t N = static_cast<std::size_t>(rows_), R = static_cast<std::size_t>(rows_mine_);
    const std::size_t C = shape.hidden, Cm = layout_.hidden_local(), Fm = layout_.ffn_local();
    const std::size_t Vm = layout_.vocab_local();
    const std::size_t att = static_cast<std::size_t>(B_) * layout_.heads_local() * T_ * T_;
    const auto all_rows_buffer = [&] { return DeviceBuffer(ops, sequence_parallel_ ? N * C : 0); };

    params_ = DeviceBuffer(ops, layout_.total());
    grads_ = DeviceBuffer(ops, layout_.total());

    inputs_ = DeviceBuffer(ops, N);
    targets_ = DeviceBuffer(ops, N);
    embedded_ = DeviceBuffer(ops, sequence_parallel_ ? N * C : 0);
    encoded_ = DeviceBuffer(ops, R * C);
    acts_.resize(static_cast<std::size_t>(shape.layers));
    for (auto& a : acts_) {
        a.ln1 = DeviceBuffer(ops, R * C);
        a.ln1_mean = DeviceBuffer(ops, R);
        a.ln1_rstd = DeviceBuffer(ops, R);
        a.ln1_all = all_rows_buffer();
        a.qkv = DeviceBuffer(ops, N * 3 * Cm);
        a.att = DeviceBuffer(ops, att);
        a.atty = DeviceBuffer(ops, N * Cm);
        a.resid2 = DeviceBuffer(ops, R * C);
        a.ln2 = DeviceBuffer(ops, R * C);
        a.ln2_mean = DeviceBuffer(ops, R);
        a.ln2_rstd = DeviceBuffer(ops, R);
        a.ln2_all = all_rows_buffer();
        a.fch = DeviceBuffer(ops, N * Fm);
        a.fch_gelu = DeviceBuffer(ops, N * Fm);
        a.resid3 = DeviceBuffer(ops, R * C);
    }
    lnf_ = DeviceBuffer(ops, R * C);
    lnf_mean_ = DeviceBuffer(ops, R);
    lnf_rstd_ = DeviceBuffer(ops, R);
    lnf_all_ = all_rows_buffer();
    logits_ = DeviceBuffer(ops, N * Vm);
    loss_stats_ = DeviceBuffer(ops, 4 * N);
    lse_ = DeviceBuffer(ops, N);
    losses_ = DeviceBuffer(ops, N);
    proj_partial_ = DeviceBuffer(ops, N * C);
    proj_reduced_ = DeviceBuffer(ops, sequence_parallel_ ? R * C : 0);

    dresidual_ = DeviceBuffer(ops, R * C);
    dc_a_ = DeviceBuffer(ops, N * C);
    dc_b_ = DeviceBuffer(ops, N * C);
    dc_mine_ = DeviceBuffer(ops, R * C);
    dc_all_ = all_rows_buffer();
    df_a_ = DeviceBuffer(ops, N * Fm);
    df_b_ = DeviceBuffer(ops, N * Fm);
    dqkv_ = DeviceBuffer(ops, N * 3 * Cm);
    datt_ = DeviceBuffer(ops, att);
}

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
            const bool gain = ends_with("ln_1.weight") || ends_with("ln_2.weight") ||
                              t.name == "ln_f.weight";
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
    ops_.copy_from_host(params_.data(), local.data(), layout_.total());
}

void Gpt::load_full_params(const std::vector<float>& full) {
    std::vector<float> local(layout_.total());
    shard_params(ParamLayout(layout_.shape()), full.data(), layout_, local.data());
    load_params(local);
}

std::vector<float> Gpt::params_to_host() const {
    std::vector<float> host(layout_.total());
    ops_.copy_to_host(host.data(), params_.data(), host.size());
    return host;
}

std::vector<float> Gpt::grads_to_host() const {
    std::vector<float> host(layout_.total());
    ops_.copy_to_host(host.data(), grads_.data(), host.size());
    return host;
}

namespace {

// Every tensor-parallel rank's slice of a flat buffer, put back together.
std::vector<float> gather_full(parallel::Comm& tensor, const ParamLayout& layout,
                               const std::vector<float>& local) {
    const std::size_t n = local.size();
    std::vector<float> slices(n * static_cast<std::size_t>(tensor.size()));
    tensor.all_gather(local.data(), slices.data(), n);
    const ParamLayout full_layout(layout.shape());
    std::vector<float> full(full_layout.total());
    for (int r = 0; r < tensor.size(); ++r)
        unshard_params(ParamLayout(layout.shape(), r, tensor.size()),
                       slices.data() + static_cast<std::size_t>(r) * n, full_layout, full.data());
    return full;
}

}  // namespace

std::vector<float> Gpt::full_params_to_host() {
    return gather_full(tensor_, layout_, params_to_host());
}

std::vector<float> Gpt::full_grads_to_host() {
    return gather_full(tensor_, layout_, grads_to_host());
}

void Gpt::zero_grads() { ops_.zero(grads_.data(), grads_.size()); }

uint64_t Gpt::site_seed(int layer, int site) const {
    return kernels::hash64(dropout_seed_, static_cast<uint64_t>(layer + 1) * 4 + site);
}

const float* Gpt::all_rows(const float* mine, float* all) {
    if (!sequence_parallel_) return mine;
    tensor_.all_gather(mine, all, static_cast<std::size_t>(rows_mine_) * layout_.shape().hidden);
    return all;
}

float* Gpt::reduce_rows(float* partial, float* mine) {
    const std::size_t C = layout_.shape().hidden;
    if (!sequence_parallel_) {
        tensor_.all_reduce(partial, static_cast<std::size_t>(rows_) * C);
        return partial;
    }
    tensor_.reduce_scatter(partial, mine, static_cast<std::size_t>(rows_mine_) * C);
    return mine;
}

float Gpt::forward(const int32_t* inputs, const int32_t* targets, bool training,
                   uint64_t dropout_seed) {
    const GptShape& s = layout_.shape();
    const int N = rows_;
    forward_logits(inputs, training, dropout_seed);
    upload_tokens(ops_, targets_, targets, static_cast<std::size_t>(N));

    // Vocab-parallel cross-entropy: three numbers per row cross the tensor group, never the
    // logits. loss_stats_ = row max | global max | sum of exps | target logit, each (N).
    float* row_max = loss_stats_.data();
    float* global_max = row_max + N;
    float* sums = global_max + N;  // sum of exps and target logit, reduced in one call
    float* target_logit = sums + N;
    ops_.cross_entropy_partials(row_max, sums, target_logit, logits_.data(), as_tokens(targets_), N,
                                layout_.vocab_begin(), s.vocab, layout_.vocab_local());
    ops_.copy(global_max, row_max, static_cast<std::size_t>(N));
    tensor_.all_reduce(global_max, static_cast<std::size_t>(N), parallel::ReduceOp::max);
    ops_.cross_entropy_rescale(sums, row_max, global_max, N);
    tensor_.all_reduce(sums, 2 * static_cast<std::size_t>(N));
    ops_.cross_entropy_losses(losses_.data(), lse_.data(), global_max, sums, target_logit, N);

    std::vector<float> losses(static_cast<std::size_t>(N));
    ops_.copy_to_host(losses.data(), losses_.data(), losses.size());
    double sum = 0.0;  // in order, in double: the same on every run
    for (float x : losses) sum += x;
    return static_cast<float>(sum / N);
}

std::vector<float> Gpt::logits_at(const int32_t* inputs, int position) {
    if (layout_.tensor_size() != 1)
        throw Error("generation runs on one process (parallel.tensor = 1)");
    const GptShape& s = layout_.shape();
    forward_logits(inputs, false, 0);
    std::vector<float> row(static_cast<std::size_t>(s.vocab));  // padded columns dropped
    ops_.copy_to_host(row.data(), logits_.data() + static_cast<std::size_t>(position) * s.padded_vocab,
                      row.size());
    return row;
}

void Gpt::forward_logits(const int32_t* inputs, bool training, uint64_t dropout_seed) {
    const GptShape& s = layout_.shape();
    const int B = B_, T = T_, C = s.hidden, R = rows_mine_, N = rows_;
    const int Cm = layout_.hidden_local(), Fm = layout_.ffn_local(), NHm = layout_.heads_local();
    const std::size_t RC = static_cast<std::size_t>(R) * C;
    const float drop = training ? dropout_ : 0.0f;
    training_ = training;
    dropout_seed_ = dropout_seed;
    float* w = params_.data();

    upload_tokens(ops_, inputs_, inputs, static_cast<std::size_t>(N));

    // Vocab-parallel embedding: each rank looks up the tokens of its vocabulary slice (zero
    // rows for the rest) and the sum over the group is the embedding; wpe is added once, by
    // tensor rank 0, so the sum is exact.
    float* embedded = sequence_parallel_ ? embedded_.data() : encoded_.data();
    ops_.embedding_forward(embedded, as_tokens(inputs_), w + layout_.wte(),
                           tensor_.rank() == 0 ? w + layout_.wpe() : nullptr, B, T, C,
                           layout_.vocab_begin(), layout_.vocab_local());
    float* encoded = reduce_rows(embedded, encoded_.data());
    if (drop > 0) ops_.dropout_forward(encoded, encoded, RC, drop, site_seed(-1, 0), first_element_);

    const float* residual = encoded;  // (R,C)
    for (int l = 0; l < s.layers; ++l) {
        const LayerParams& p = layout_.layer(l);
        LayerActivations& a = acts_[static_cast<std::size_t>(l)];
        // Attention: LN -> f -> column-parallel qkv -> this rank's heads -> row-parallel
        // proj -> g -> bias -> dropout -> residual.
        ops_.layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual,
                               w + p.ln1_w, w + p.ln1_b, R, C);
        const float* ln1 = all_rows(a.ln1.data(), a.ln1_all.data());
        ops_.matmul_forward(a.qkv.data(), ln1, w + p.qkv_w, w + p.qkv_b, N, C, 3 * Cm);
        ops_.attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, T, Cm, NHm, drop,
                               site_seed(l, 0), layout_.heads_begin(), s.heads);
        ops_.matmul_forward(proj_partial_.data(), a.atty.data(), w + p.proj_w, nullptr, N, Cm, C);
        float* attproj = reduce_rows(proj_partial_.data(), proj_reduced_.data());
        ops_.add_bias(attproj, w + p.proj_b, R, C);
        if (drop > 0) ops_.dropout_forward(attproj, attproj, RC, drop, site_seed(l, 1), first_element_);
        ops_.residual_forward(a.resid2.data(), residual, attproj, RC);

        // MLP: LN -> f -> column-parallel fc1 -> GELU -> row-parallel fc2 -> g -> bias ->
        // dropout -> residual.
        ops_.layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.resid2.data(),
                               w + p.ln2_w, w + p.ln2_b, R, C);
        const float* ln2 = all_rows(a.ln2.data(), a.ln2_all.data());
        ops_.matmul_forward(a.fch.data(), ln2, w + p.fc1_w, w + p.fc1_b, N, C, Fm);
        ops_.gelu_forward(a.fch_gelu.data(), a.fch.data(), static_cast<std::size_t>(N) * Fm);
        ops_.matmul_forward(proj_partial_.data(), a.fch_gelu.data(), w + p.fc2_w, nullptr, N, Fm, C);
        float* fcproj = reduce_rows(proj_partial_.data(), proj_reduced_.data());
        ops_.add_bias(fcproj, w + p.fc2_b, R, C);
        if (drop > 0) ops_.dropout_forward(fcproj, fcproj, RC, drop, site_seed(l, 2), first_element_);
        ops_.residual_forward(a.resid3.data(), a.resid2.data(), fcproj, RC);
        residual = a.resid3.data();
    }

    ops_.layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual,
                           w + layout_.lnf_w(), w + layout_.lnf_b(), R, C);
    // LM head tied to this rank's slice of the token embedding: logits (N,Vp/M).
    const float* lnf = all_rows(lnf_.data(), lnf_all_.data());
    ops_.matmul_forward(logits_.data(), lnf, w + layout_.wte(), nullptr, N, C,
                        layout_.vocab_local());
}

const float* Gpt::through_dropout(const float* dout, std::size_t count, float drop, uint64_t seed) {
    if (drop == 0) return dout;
    ops_.zero(dc_mine_.data(), count);
    ops_.dropout_backward(dc_mine_.data(), dout, count, drop, seed, first_element_);
    return dc_mine_.data();
}

void Gpt::backward(float dloss) {
    const GptShape& s = layout_.shape();
    const int B = B_, T = T_, C = s.hidden, R = rows_mine_, N = rows_;
    const int Cm = layout_.hidden_local(), Fm = layout_.ffn_local(), NHm = layout_.heads_local();
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    const std::size_t RC = static_cast<std::size_t>(R) * C;
    const std::size_t NFm = static_cast<std::size_t>(N) * Fm;
    const float drop = training_ ? dropout_ : 0.0f;
    const float* w = params_.data();
    float* g = grads_.data();

    // Loss and LM head. dlogits overwrite the logits; the gradient into the head's input is
    // this rank's vocabulary share (f: all-reduce, or reduce-scatter to this rank's rows).
    ops_.cross_entropy_backward(logits_.data(), logits_.data(), lse_.data(), as_tokens(targets_),
                                dloss, N, layout_.vocab_begin(), s.vocab, layout_.vocab_local());
    ops_.zero(dc_a_.data(), NC);
    const float* lnf = sequence_parallel_ ? lnf_all_.data() : lnf_.data();
    ops_.matmul_backward(dc_a_.data(), g + layout_.wte(), nullptr, logits_.data(), lnf,
                         w + layout_.wte(), N, C, layout_.vocab_local());
    const float* dlnf = reduce_rows(dc_a_.data(), dc_mine_.data());
    const float* last = s.layers > 0 ? acts_.back().resid3.data() : encoded_.data();
    ops_.zero(dresidual_.data(), RC);
    ops_.layernorm_backward(dresidual_.data(), g + layout_.lnf_w(), g + layout_.lnf_b(), dlnf,
                            last, w + layout_.lnf_w(), lnf_mean_.data(), lnf_rstd_.data(), R, C);

    // dresidual holds the gradient of this rank's rows of the residual stream; each branch
    // adds into it.
    for (int l = s.layers - 1; l >= 0; --l) {
        const LayerParams& p = layout_.layer(l);
        LayerActivations& a = acts_[static_cast<std::size_t>(l)];
        const float* residual = l == 0 ? encoded_.data() : acts_[static_cast<std::size_t>(l - 1)].resid3.data();
        const float* ln1 = sequence_parallel_ ? a.ln1_all.data() : a.ln1.data();
        const float* ln2 = sequence_parallel_ ? a.ln2_all.data() : a.ln2.data();

        // MLP branch. g backward: the gradient of fc2's output is the residual's (all rows).
        const float* dfcproj =
            all_rows(through_dropout(dresidual_.data(), RC, drop, site_seed(l, 2)), dc_all_.data());
        ops_.zero(df_a_.data(), NFm);
        ops_.matmul_backward(df_a_.data(), g + p.fc2_w, g + p.fc2_b, dfcproj, a.fch_gelu.data(),
                             w + p.fc2_w, N, Fm, C);
        ops_.zero(df_b_.data(), NFm);
        ops_.gelu_backward(df_b_.data(), a.fch.data(), df_a_.data(), NFm);
        ops_.zero(dc_a_.data(), NC);
        ops_.matmul_backward(dc_a_.data(), g + p.fc1_w, g + p.fc1_b, df_b_.data(), ln2,
                             w + p.fc1_w, N, C, Fm);
        const float* dln2 = reduce_rows(dc_a_.data(), dc_mine_.data());  // f backward
        ops_.layernorm_backward(dresidual_.data(), g + p.ln2_w, g + p.ln2_b, dln2,
                                a.resid2.data(), w + p.ln2_w, a.ln2_mean.data(), a.ln2_rstd.data(),
                                R, C);

        // Attention branch.
        const float* dattproj =
            all_rows(through_dropout(dresidual_.data(), RC, drop, site_seed(l, 1)), dc_all_.data());
        ops_.zero(dc_b_.data(), static_cast<std::size_t>(N) * Cm);
        ops_.matmul_backward(dc_b_.data(), g + p.proj_w, g + p.proj_b, dattproj, a.atty.data(),
                             w + p.proj_w, N, Cm, C);
        ops_.zero(dqkv_.data(), static_cast<std::size_t>(N) * 3 * Cm);
        ops_.attention_backward(dqkv_.data(), datt_.data(), dc_b_.data(), a.qkv.data(),
                                a.att.data(), B, T, Cm, NHm, drop, site_seed(l, 0),
                                layout_.heads_begin(), s.heads);
        ops_.zero(dc_a_.data(), NC);
        ops_.matmul_backward(dc_a_.data(), g + p.qkv_w, g + p.qkv_b, dqkv_.data(), ln1,
                             w + p.qkv_w, N, C, 3 * Cm);
        const float* dln1 = reduce_rows(dc_a_.data(), dc_mine_.data());  // f backward
        ops_.layernorm_backward(dresidual_.data(), g + p.ln1_w, g + p.ln1_b, dln1, residual,
                                w + p.ln1_w, a.ln1_mean.data(), a.ln1_rstd.data(), R, C);
    }

    // The embedding's reduction backward: every rank scatters all rows into its slice.
    const float* dencoded =
        all_rows(through_dropout(dresidual_.data(), RC, drop, site_seed(-1, 0)), dc_all_.data());
    ops_.embedding_backward(g + layout_.wte(), g + layout_.wpe(), dencoded, as_tokens(inputs_), B,
                            T, C, layout_.vocab_begin(), layout_.vocab_local());
}

void Gpt::finish_gradients() {
    if (!sequence_parallel_) return;
    // LayerNorm parameters saw only this rank's rows: sum their gradients over the group.
    const auto reduce = [&](std::size_t offset) {
        tensor_.all_reduce(grads_.data() + offset, static_cast<std::size_t>(layout_.shape().hidden));
    };
    for (int l = 0; l < layout_.shape().layers; ++l) {
        const LayerParams& p = layout_.layer(l);
        for (std::size_t offset : {p.ln1_w, p.ln1_b, p.ln2_w, p.ln2_b}) reduce(offset);
    }
    reduce(layout_.lnf_w());
    reduce(layout_.lnf_b());
}

}  // namespace trident::model
