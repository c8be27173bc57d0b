// Attention of new tokens against a key/value cache: generation's incremental decoding
// (model/kv_cache.h). Each new row's keys and values are written into the cache at its
// position, then its query attends to every cached position up to its own.
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {

// Row r's k and v (qkv (rows, 3·channels), query head g·group's for key/value head g) into the
// cache (seq_len, KVH·hs) at row `position`.
void append(float* k_cache, float* v_cache, const float* row, int position, int NH, int KVH,
            int hs) {
    const int group = NH / KVH;
    const std::size_t channels = static_cast<std::size_t>(NH) * hs;
    const std::size_t kv_row = static_cast<std::size_t>(KVH) * hs;
    for (int g = 0; g < KVH; g++) {
        const std::size_t from = static_cast<std::size_t>(g * group) * hs;
        const std::size_t to = static_cast<std::size_t>(position) * kv_row + g * hs;
        for (int i = 0; i < hs; i++) {
            k_cache[to + i] = row[channels + from + i];
            v_cache[to + i] = row[2 * channels + from + i];
        }
    }
}

// out (hs) = softmax over keys 0..last of q·k / sqrt(hs), times v, for one query head
// reading key/value head g of the cache.
void attend(float* out, const float* q, const float* k_cache, const float* v_cache, int last, int g,
            int KVH, int hs) {
    const std::size_t kv_row = static_cast<std::size_t>(KVH) * hs;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    std::vector<float> p(static_cast<std::size_t>(last) + 1);
    float max = -INFINITY;
    for (int j = 0; j <= last; j++) {
        const float* k = k_cache + j * kv_row + static_cast<std::size_t>(g) * hs;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) s += q[i] * k[i];
        p[static_cast<std::size_t>(j)] = s * scale;
        if (p[static_cast<std::size_t>(j)] > max) max = p[static_cast<std::size_t>(j)];
    }
    float sum = 0.0f;
    for (float& x : p) {
        x = std::exp(x - max);
        sum += x;
    }
    for (int i = 0; i < hs; i++) out[i] = 0.0f;
    for (int j = 0; j <= last; j++) {
        const float w = p[static_cast<std::size_t>(j)] / sum;
        const float* v = v_cache + j * kv_row + static_cast<std::size_t>(g) * hs;
        for (int i = 0; i < hs; i++) out[i] += w * v[i];
    }
}

}  // namespace

void cached_attention_forward(float* out, float* k_cache, float* v_cache, const float* qkv,
                              int rows, int first, int NH, int KVH, int hs) {
    const std::size_t channels = static_cast<std::size_t>(NH) * hs;
    for (int r = 0; r < rows; r++)
        append(k_cache, v_cache, qkv + r * 3 * channels, first + r, NH, KVH, hs);
    const int group = NH / KVH;
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < NH; h++)
            attend(out + r * channels + static_cast<std::size_t>(h) * hs,
                   qkv + r * 3 * channels + static_cast<std::size_t>(h) * hs, k_cache, v_cache,
                   first + r, h / group, KVH, hs);
}

}  // namespace trident::kernels::cpu
