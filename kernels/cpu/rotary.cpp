// Rotary position embedding (Su et al. 2021) in Hugging Face Llama's rotate-half convention,
// fused with grouped-query attention's sharing of key/value heads: the grouped q, k, v of the
// attention's input linear become the q, k, v attention_forward reads, and back.
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {

// cos and sin (hs/2 each) of the angles p·θ^(−2i/hs) of sequence position p, computed in fp32
// as Hugging Face's LlamaRotaryEmbedding does (inv_freq, then the product, then cos and sin).
void angles(float* cos_out, float* sin_out, int p, int hs, float theta) {
    for (int i = 0; i < hs / 2; i++) {
        const float inv_freq =
            1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(hs));
        const float a = static_cast<float>(p) * inv_freq;
        cos_out[i] = std::cos(a);
        sin_out[i] = std::sin(a);
    }
}

// y (hs) = x rotated by the angles (sign +1), or back (sign −1, the transpose), added into y
// when `add`.
void rotate(float* y, const float* x, const float* c, const float* s, int hs, float sign,
            bool add) {
    const int half = hs / 2;
    for (int i = 0; i < half; i++) {
        const float a = x[i] * c[i] - sign * x[i + half] * s[i];
        const float b = x[i + half] * c[i] + sign * x[i] * s[i];
        y[i] = add ? y[i] + a : a;
        y[i + half] = add ? y[i + half] + b : b;
    }
}

int position_of(const int32_t* positions, int t) {
    return positions ? positions[t] : t;
}

}  // namespace

void rotary_qkv_forward(float* out, const float* qkv, int B, int T, int NH, int KVH, int hs,
                        float theta, const int32_t* positions) {
    const int group = NH / KVH;
    const std::size_t in_row = static_cast<std::size_t>(NH + 2 * KVH) * hs;
    const std::size_t channels = static_cast<std::size_t>(NH) * hs, out_row = 3 * channels;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        std::vector<float> c(static_cast<std::size_t>(hs / 2)), s(c.size());
        angles(c.data(), s.data(), position_of(positions, n % T), hs, theta);
        const float* q = qkv + n * in_row;
        const float* k = q + channels;
        const float* v = k + static_cast<std::size_t>(KVH) * hs;
        float* y = out + n * out_row;
        for (int h = 0; h < NH; h++) {
            const std::size_t qh = static_cast<std::size_t>(h) * hs;
            const std::size_t kh = static_cast<std::size_t>(h / group) * hs;
            rotate(y + qh, q + qh, c.data(), s.data(), hs, 1.0f, false);
            rotate(y + channels + qh, k + kh, c.data(), s.data(), hs, 1.0f, false);
            std::copy(v + kh, v + kh + hs, y + 2 * channels + qh);
        }
    }
}

void rotary_qkv_backward(float* dqkv, const float* dout, int B, int T, int NH, int KVH, int hs,
                         float theta, const int32_t* positions) {
    const int group = NH / KVH;
    const std::size_t in_row = static_cast<std::size_t>(NH + 2 * KVH) * hs;
    const std::size_t channels = static_cast<std::size_t>(NH) * hs, out_row = 3 * channels;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < B * T; n++) {
        std::vector<float> c(static_cast<std::size_t>(hs / 2)), s(c.size());
        angles(c.data(), s.data(), position_of(positions, n % T), hs, theta);
        float* dq = dqkv + n * in_row;
        float* dk = dq + channels;
        float* dv = dk + static_cast<std::size_t>(KVH) * hs;
        const float* dy = dout + n * out_row;
        // Query heads in order, so each kv head sums its group's gradients in head order.
        for (int h = 0; h < NH; h++) {
            const std::size_t qh = static_cast<std::size_t>(h) * hs;
            const std::size_t kh = static_cast<std::size_t>(h / group) * hs;
            rotate(dq + qh, dy + qh, c.data(), s.data(), hs, -1.0f, true);
            rotate(dk + kh, dy + channels + qh, c.data(), s.data(), hs, -1.0f, true);
            for (int i = 0; i < hs; i++) dv[kh + i] += dy[2 * channels + qh + i];
        }
    }
}

}  // namespace trident::kernels::cpu
