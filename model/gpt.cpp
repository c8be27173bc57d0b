// GPT-2 forward and backward for one microbatch (see model/gpt.h).
#include "model/gpt.h"

#include <cmath>
#include <cstring>
#include <utility>

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

Gpt::Gpt(kernels::Ops& ops, const GptShape& shape, int micro_batch, float dropout)
    : ops_(ops), layout_(shape), B_(micro_batch), T_(shape.max_seq), dropout_(dropout) {
    const std::size_t N = static_cast<std::size_t>(B_) * T_;
    const std::size_t C = shape.hidden, F = shape.ffn, NH = shape.heads, Vp = shape.padded_vocab;
    const std::size_t att = static_cast<std::size_t>(B_) * NH * T_ * T_;

    params_ = DeviceBuffer(ops, layout_.total());
    grads_ = DeviceBuffer(ops, layout_.total());

    inputs_ = DeviceBuffer(ops, N);
    targets_ = DeviceBuffer(ops, N);
    encoded_ = DeviceBuffer(ops, N * C);
    acts_.resize(static_cast<std::size_t>(shape.layers));
    for (auto& a : acts_) {
        a.ln1 = DeviceBuffer(ops, N * C);
        a.ln1_mean = DeviceBuffer(ops, N);
        a.ln1_rstd = DeviceBuffer(ops, N);
        a.qkv = DeviceBuffer(ops, N * 3 * C);
        a.att = DeviceBuffer(ops, att);
        a.atty = DeviceBuffer(ops, N * C);
        a.attproj = DeviceBuffer(ops, N * C);
        a.resid2 = DeviceBuffer(ops, N * C);
        a.ln2 = DeviceBuffer(ops, N * C);
        a.ln2_mean = DeviceBuffer(ops, N);
        a.ln2_rstd = DeviceBuffer(ops, N);
        a.fch = DeviceBuffer(ops, N * F);
        a.fch_gelu = DeviceBuffer(ops, N * F);
        a.fcproj = DeviceBuffer(ops, N * C);
        a.resid3 = DeviceBuffer(ops, N * C);
    }
    lnf_ = DeviceBuffer(ops, N * C);
    lnf_mean_ = DeviceBuffer(ops, N);
    lnf_rstd_ = DeviceBuffer(ops, N);
    logits_ = DeviceBuffer(ops, N * Vp);
    lse_ = DeviceBuffer(ops, N);
    losses_ = DeviceBuffer(ops, N);

    dresidual_ = DeviceBuffer(ops, N * C);
    dc_a_ = DeviceBuffer(ops, N * C);
    dc_b_ = DeviceBuffer(ops, N * C);
    df_a_ = DeviceBuffer(ops, N * F);
    df_b_ = DeviceBuffer(ops, N * F);
    dqkv_ = DeviceBuffer(ops, N * 3 * C);
    datt_ = DeviceBuffer(ops, att);
}

void Gpt::init_random(uint64_t seed, float init_std) {
    const GptShape& s = layout_.shape();
    const double residual_std = init_std / std::sqrt(2.0 * s.layers);
    std::vector<float> host(layout_.total(), 0.0f);
    const auto& tensors = layout_.tensors();
    for (std::size_t ti = 0; ti < tensors.size(); ++ti) {
        const ParamTensor& t = tensors[ti];
        float* p = host.data() + t.offset;
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
        if (t.offset == layout_.wte()) count = static_cast<std::size_t>(s.vocab) * s.hidden;
        const uint64_t tensor_seed = kernels::hash64(seed, ti);
        for (std::size_t i = 0; i < count; ++i)
            p[i] = static_cast<float>(stddev * kernels::normal(tensor_seed, i));
    }
    load_params(host);
}

void Gpt::load_params(const std::vector<float>& host) {
    ops_.copy_from_host(params_.data(), host.data(), layout_.total());
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

void Gpt::zero_grads() { ops_.zero(grads_.data(), grads_.size()); }

uint64_t Gpt::site_seed(int layer, int site) const {
    return kernels::hash64(dropout_seed_, static_cast<uint64_t>(layer + 1) * 4 + site);
}

float Gpt::forward(const int32_t* inputs, const int32_t* targets, bool training,
                   uint64_t dropout_seed) {
    const GptShape& s = layout_.shape();
    const int N = B_ * T_;
    forward_logits(inputs, training, dropout_seed);
    upload_tokens(ops_, targets_, targets, static_cast<std::size_t>(N));
    ops_.cross_entropy_forward(losses_.data(), lse_.data(), logits_.data(), as_tokens(targets_), N,
                               s.vocab, s.padded_vocab);

    std::vector<float> losses(static_cast<std::size_t>(N));
    ops_.copy_to_host(losses.data(), losses_.data(), losses.size());
    double sum = 0.0;  // in order, in double: the same on every run
    for (float x : losses) sum += x;
    return static_cast<float>(sum / N);
}

std::vector<float> Gpt::logits_at(const int32_t* inputs, int position) {
    const GptShape& s = layout_.shape();
    forward_logits(inputs, false, 0);
    std::vector<float> row(static_cast<std::size_t>(s.vocab));  // padded columns dropped
    ops_.copy_to_host(row.data(), logits_.data() + static_cast<std::size_t>(position) * s.padded_vocab,
                      row.size());
    return row;
}

void Gpt::forward_logits(const int32_t* inputs, bool training, uint64_t dropout_seed) {
    const GptShape& s = layout_.shape();
    const int B = B_, T = T_, C = s.hidden, F = s.ffn, NH = s.heads;
    const int N = B * T;
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    const float drop = training ? dropout_ : 0.0f;
    training_ = training;
    dropout_seed_ = dropout_seed;
    float* w = params_.data();

    upload_tokens(ops_, inputs_, inputs, static_cast<std::size_t>(N));

    ops_.embedding_forward(encoded_.data(), as_tokens(inputs_), w + layout_.wte(),
                           w + layout_.wpe(), B, T, C);
    if (drop > 0) ops_.dropout_forward(encoded_.data(), encoded_.data(), NC, drop, site_seed(-1, 0));

    const float* residual = encoded_.data();  // (B,T,C)
    for (int l = 0; l < s.layers; ++l) {
        const LayerParams& p = layout_.layer(l);
        LayerActivations& a = acts_[static_cast<std::size_t>(l)];
        ops_.layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual,
                               w + p.ln1_w, w + p.ln1_b, N, C);
        ops_.matmul_forward(a.qkv.data(), a.ln1.data(), w + p.qkv_w, w + p.qkv_b, N, C, 3 * C);
        ops_.attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), B, T, C, NH, drop,
                               site_seed(l, 0));
        ops_.matmul_forward(a.attproj.data(), a.atty.data(), w + p.proj_w, w + p.proj_b, N, C, C);
        if (drop > 0) ops_.dropout_forward(a.attproj.data(), a.attproj.data(), NC, drop, site_seed(l, 1));
        ops_.residual_forward(a.resid2.data(), residual, a.attproj.data(), NC);

        ops_.layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.resid2.data(),
                               w + p.ln2_w, w + p.ln2_b, N, C);
        ops_.matmul_forward(a.fch.data(), a.ln2.data(), w + p.fc1_w, w + p.fc1_b, N, C, F);
        ops_.gelu_forward(a.fch_gelu.data(), a.fch.data(), static_cast<std::size_t>(N) * F);
        ops_.matmul_forward(a.fcproj.data(), a.fch_gelu.data(), w + p.fc2_w, w + p.fc2_b, N, F, C);
        if (drop > 0) ops_.dropout_forward(a.fcproj.data(), a.fcproj.data(), NC, drop, site_seed(l, 2));
        ops_.residual_forward(a.resid3.data(), a.resid2.data(), a.fcproj.data(), NC);
        residual = a.resid3.data();
    }

    ops_.layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual,
                           w + layout_.lnf_w(), w + layout_.lnf_b(), N, C);
    // LM head tied to the token embedding: logits (B,T,Vp) = lnf @ wte^T.
    ops_.matmul_forward(logits_.data(), lnf_.data(), w + layout_.wte(), nullptr, N, C,
                        s.padded_vocab);
}

const float* Gpt::through_dropout(const float* dout, std::size_t count, float drop, uint64_t seed) {
    if (drop == 0) return dout;
    ops_.zero(dc_b_.data(), count);
    ops_.dropout_backward(dc_b_.data(), dout, count, drop, seed);
    return dc_b_.data();
}

void Gpt::backward(float dloss) {
    const GptShape& s = layout_.shape();
    const int B = B_, T = T_, C = s.hidden, F = s.ffn, NH = s.heads;
    const int N = B * T;
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    const std::size_t NF = static_cast<std::size_t>(N) * F;
    const float drop = training_ ? dropout_ : 0.0f;
    const float* w = params_.data();
    float* g = grads_.data();

    // Loss and LM head. dlogits overwrite the logits.
    ops_.cross_entropy_backward(logits_.data(), logits_.data(), lse_.data(), as_tokens(targets_),
                                dloss, N, s.vocab, s.padded_vocab);
    ops_.zero(dc_a_.data(), NC);
    ops_.matmul_backward(dc_a_.data(), g + layout_.wte(), nullptr, logits_.data(), lnf_.data(),
                         w + layout_.wte(), N, C, s.padded_vocab);
    const float* last = s.layers > 0 ? acts_.back().resid3.data() : encoded_.data();
    ops_.zero(dresidual_.data(), NC);
    ops_.layernorm_backward(dresidual_.data(), g + layout_.lnf_w(), g + layout_.lnf_b(),
                            dc_a_.data(), last, w + layout_.lnf_w(), lnf_mean_.data(),
                            lnf_rstd_.data(), N, C);

    // dresidual holds the gradient of the residual stream; each branch adds into it.
    for (int l = s.layers - 1; l >= 0; --l) {
        const LayerParams& p = layout_.layer(l);
        LayerActivations& a = acts_[static_cast<std::size_t>(l)];
        const float* residual = l == 0 ? encoded_.data() : acts_[static_cast<std::size_t>(l - 1)].resid3.data();

        // MLP branch: resid3 = resid2 + dropout(fc2(gelu(fc1(ln2(resid2)))))
        const float* dfcproj = through_dropout(dresidual_.data(), NC, drop, site_seed(l, 2));
        ops_.zero(df_a_.data(), NF);
        ops_.matmul_backward(df_a_.data(), g + p.fc2_w, g + p.fc2_b, dfcproj, a.fch_gelu.data(),
                             w + p.fc2_w, N, F, C);
        ops_.zero(df_b_.data(), NF);
        ops_.gelu_backward(df_b_.data(), a.fch.data(), df_a_.data(), NF);
        ops_.zero(dc_a_.data(), NC);
        ops_.matmul_backward(dc_a_.data(), g + p.fc1_w, g + p.fc1_b, df_b_.data(), a.ln2.data(),
                             w + p.fc1_w, N, C, F);
        ops_.layernorm_backward(dresidual_.data(), g + p.ln2_w, g + p.ln2_b, dc_a_.data(),
                                a.resid2.data(), w + p.ln2_w, a.ln2_mean.data(), a.ln2_rstd.data(),
                                N, C);

        // Attention branch: resid2 = resid + dropout(proj(attention(qkv(ln1(resid)))))
        const float* dattproj = through_dropout(dresidual_.data(), NC, drop, site_seed(l, 1));
        ops_.zero(dc_a_.data(), NC);
        ops_.matmul_backward(dc_a_.data(), g + p.proj_w, g + p.proj_b, dattproj, a.atty.data(),
                             w + p.proj_w, N, C, C);
        ops_.zero(dqkv_.data(), NC * 3);
        ops_.attention_backward(dqkv_.data(), datt_.data(), dc_a_.data(), a.qkv.data(),
                                a.att.data(), B, T, C, NH, drop, site_seed(l, 0));
        ops_.zero(dc_b_.data(), NC);
        ops_.matmul_backward(dc_b_.data(), g + p.qkv_w, g + p.qkv_b, dqkv_.data(), a.ln1.data(),
                             w + p.qkv_w, N, C, 3 * C);
        ops_.layernorm_backward(dresidual_.data(), g + p.ln1_w, g + p.ln1_b, dc_b_.data(), residual,
                                w + p.ln1_w, a.ln1_mean.data(), a.ln1_rstd.data(), N, C);
    }

    const float* dencoded = through_dropout(dresidual_.data(), NC, drop, site_seed(-1, 0));
    ops_.embedding_backward(g + layout_.wte(), g + layout_.wpe(), dencoded, as_tokens(inputs_), B,
                            T, C);
}

}  // namespace trident::model
