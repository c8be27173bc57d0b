// The NF4 quantizer and dequantizer (see nf4.h).
#include "kernels/nf4.h"

#include <algorithm>
#include <cmath>

#include "kernels/error.h"

namespace trident::kernels {

namespace {

// The index of the code nearest to x, the lower one on a tie. Distances in double: a float's
// distance to a code is then exact or correctly rounded, the same on every machine.
uint8_t nearest_code(float x) {
    uint8_t best = 0;
    double best_distance = std::fabs(static_cast<double>(x) - kNf4Codes[0]);
    for (uint8_t i = 1; i < kNf4Codes.size(); ++i) {
        const double distance = std::fabs(static_cast<double>(x) - kNf4Codes[i]);
        if (distance < best_distance) best = i, best_distance = distance;
    }
    return best;
}

// Round half away from zero, in fp32 (|x| <= 127 here).
float round_half_away(float x) {
    const float whole = std::trunc(x);
    if (std::fabs(x - whole) >= 0.5f) return whole + (x < 0 ? -1.0f : 1.0f);
    return whole;
}

std::vector<float> block_absmax(std::span<const float> w, std::size_t block) {
    std::vector<float> absmax((w.size() + block - 1) / block, 0.0f);
    for (std::size_t i = 0; i < w.size(); ++i)
        absmax[i / block] = std::max(absmax[i / block], std::fabs(w[i]));
    return absmax;
}

// The second level (nf4.h): c, the scales and the int8 codes of `absmax`.
void double_quantize(Nf4Tensor& t, const std::vector<float>& absmax) {
    double sum = 0;
    for (float a : absmax) sum += a;
    t.absmax_mean = static_cast<float>(sum / static_cast<double>(absmax.size()));
    const float c = t.absmax_mean;
    t.absmax_scale.assign((absmax.size() + kNf4AbsmaxBlock - 1) / kNf4AbsmaxBlock, 0.0f);
    for (std::size_t b = 0; b < absmax.size(); ++b) {
        float& s = t.absmax_scale[b / kNf4AbsmaxBlock];
        s = std::max(s, std::fabs(absmax[b] - c));
    }
    t.absmax_q.resize(absmax.size());
    for (std::size_t b = 0; b < absmax.size(); ++b) {
        const float s = t.absmax_scale[b / kNf4AbsmaxBlock];
        const float scaled = s == 0.0f ? 0.0f : (absmax[b] - c) / s * 127.0f;
        t.absmax_q[b] = static_cast<int8_t>(round_half_away(scaled));
    }
}

}  // namespace

float Nf4Tensor::block_absmax(std::size_t b) const {
    if (!double_quant()) return absmax[b];
    return nf4_absmax(absmax_q[b], absmax_scale[map.whole(b) / kNf4AbsmaxBlock], absmax_mean);
}

std::size_t Nf4Tensor::bytes() const {
    const std::size_t constants =
        double_quant() ? absmax_q.size() + 4 * absmax_scale.size() + 4 : 4 * absmax.size();
    return codes.size() + constants;
}

Nf4Tensor nf4_quantize(std::span<const float> weights, std::size_t block, bool double_quant) {
    if (block == 0) throw Error("internal: an NF4 block of 0 elements");
    Nf4Tensor t;
    t.size = weights.size();
    t.block = block;
    std::vector<float> absmax = block_absmax(weights, block);
    t.codes.assign((t.size + 1) / 2, 0);
    for (std::size_t i = 0; i < t.size; ++i) {
        const float a = absmax[i / block];
        const uint8_t code = a == 0.0f ? uint8_t{7} : nearest_code(weights[i] / a);
        t.codes[i / 2] |= static_cast<uint8_t>(i % 2 ? code << 4 : code);
    }
    if (double_quant && !absmax.empty())
        double_quantize(t, absmax);
    else
        t.absmax = std::move(absmax);
    return t;
}

Nf4Tensor nf4_shard(const Nf4Tensor& whole, const Nf4BlockMap& map, std::size_t blocks) {
    Nf4Tensor t;
    t.block = whole.block;
    t.map = map;
    t.size = blocks * t.block;
    if (blocks && (map.whole(blocks - 1) + 1) * t.block > whole.size)
        throw Error("internal: an NF4 shard's blocks outside its matrix");
    t.codes.assign((t.size + 1) / 2, 0);
    for (std::size_t b = 0; b < blocks; ++b)
        for (std::size_t i = 0; i < t.block; ++i) {
            const std::size_t from = map.whole(b) * t.block + i, to = b * t.block + i;
            const uint8_t code =
                from % 2 ? whole.codes[from / 2] >> 4 : whole.codes[from / 2] & 0xF;
            t.codes[to / 2] |= static_cast<uint8_t>(to % 2 ? code << 4 : code);
        }
    const auto take = [&](const auto& all, auto& mine) {
        for (std::size_t b = 0; b < blocks; ++b) mine.push_back(all[map.whole(b)]);
    };
    if (!whole.double_quant()) {
        take(whole.absmax, t.absmax);
        return t;
    }
    take(whole.absmax_q, t.absmax_q);
    t.absmax_scale = whole.absmax_scale;
    t.absmax_mean = whole.absmax_mean;
    return t;
}

void nf4_dequantize(const Nf4Tensor& t, std::span<float> out) {
    if (out.size() != t.size) throw Error("internal: NF4 dequantize size mismatch");
    for (std::size_t b = 0; b < t.blocks(); ++b) {
        const float a = t.block_absmax(b);
        const std::size_t end = std::min((b + 1) * t.block, t.size);
        for (std::size_t i = b * t.block; i < end; ++i) {
            const uint8_t byte = t.codes[i / 2];
            out[i] = kNf4Codes[i % 2 ? byte >> 4 : byte & 0xF] * a;
        }
    }
}

}  // namespace trident::kernels
