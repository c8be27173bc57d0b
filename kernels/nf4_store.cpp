// Where quantized matrices lie in bytes, group by group (see nf4_store.h).
#include "kernels/nf4_store.h"

#include <cstring>

#include "kernels/error.h"

namespace trident::kernels {

std::size_t Nf4Shape::float_bytes() const {
    if (!double_quant) return 4 * blocks();
    const std::size_t whole_blocks = (whole + block - 1) / block;
    return 4 * ((whole_blocks + kNf4AbsmaxBlock - 1) / kNf4AbsmaxBlock) + 4;  // scales, mean
}

Nf4Store::Nf4Store(const std::vector<std::vector<Nf4Shape>>& groups, std::size_t multiple) {
    std::size_t begin = 0;
    for (const std::vector<Nf4Shape>& group : groups) {
        std::size_t floats = 0, codes = 0, absmax_codes = 0;  // each part's bytes in the group
        for (const Nf4Shape& s : group) {
            floats += s.float_bytes();
            codes += s.code_bytes();
            absmax_codes += s.absmax_code_bytes();
        }
        std::size_t at[3] = {0, floats, floats + codes};  // each part's next byte
        for (const Nf4Shape& s : group) {
            places_.push_back(Place{s, groups_.size(), at[0], at[1], at[2]});
            at[0] += s.float_bytes();
            at[1] += s.code_bytes();
            at[2] += s.absmax_code_bytes();
        }
        const std::size_t used = floats + codes + absmax_codes;
        const std::size_t padded = (used + multiple - 1) / multiple * multiple;
        groups_.emplace_back(begin, begin + padded);
        begin += padded;
    }
}

std::vector<uint8_t> Nf4Store::pack(std::span<const Nf4Tensor> matrices) const {
    if (matrices.size() != places_.size())
        throw Error("internal: " + std::to_string(matrices.size()) +
                    " NF4 matrices for a store of " + std::to_string(places_.size()));
    std::vector<uint8_t> bytes(this->bytes(), 0);
    // Copies `values` to byte `at` of the matrix's group.
    const auto put = [&](const Place& p, std::size_t at, const auto& values) {
        const std::size_t n = values.size() * sizeof(values[0]);
        if (n) std::memcpy(bytes.data() + groups_[p.group].first + at, values.data(), n);
        return n;
    };
    for (std::size_t i = 0; i < places_.size(); ++i) {
        const Place& p = places_[i];
        const Nf4Tensor& m = matrices[i];
        std::size_t floats = 0;
        if (p.shape.double_quant) {
            floats += put(p, p.floats, std::vector<float>{m.absmax_mean});
            floats += put(p, p.floats + floats, m.absmax_scale);
        } else {
            floats += put(p, p.floats, m.absmax);
        }
        if (m.size != p.shape.count || m.double_quant() != p.shape.double_quant ||
            floats != p.shape.float_bytes() || put(p, p.codes, m.codes) != p.shape.code_bytes() ||
            put(p, p.absmax_codes, m.absmax_q) != p.shape.absmax_code_bytes())
            throw Error("internal: NF4 matrix " + std::to_string(i) + " is not the store's shape");
    }
    return bytes;
}

Nf4Matrix Nf4Store::view(std::size_t i, const uint8_t* group) const {
    const Place& p = places_[i];
    Nf4Matrix m{.count = p.shape.count, .block = p.shape.block, .map = p.shape.map};
    m.codes = group + p.codes;
    const auto* floats = reinterpret_cast<const float*>(group + p.floats);
    if (p.shape.double_quant) {
        m.absmax_mean = floats;
        m.absmax_scale = floats + 1;
        m.absmax_q = reinterpret_cast<const int8_t*>(group + p.absmax_codes);
    } else {
        m.absmax = floats;
    }
    return m;
}

}  // namespace trident::kernels
