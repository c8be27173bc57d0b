// Nf4Store: where quantized matrices (kernels/nf4.h) lie in bytes as the op set reads them
// (kernels::Nf4Matrix, Ops::nf4_dequantize), in groups: each group's bytes are its matrices'
// fp32 constants, then their codes, then their int8 absmax codes, so that each part is aligned
// without padding inside the group, and the group is padded at its end to a multiple of
// `multiple` bytes (a group a ZeRO-3 unit split evenly over the ranks that shard it,
// src/data_parallel/zero_units.h). The store knows the places, packs the host's matrices into
// them and gives the device view of one matrix from its group's bytes; the memory holding the
// bytes is its holder's (model/nf4_base.h: one allocation, or sharded group by group). One
// group padded to 1 holds exactly the format's bytes (Nf4Tensor::bytes, summed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "kernels/nf4.h"

namespace trident::kernels {

// One matrix, or one rank's shard of one, before it is quantized: `count` elements of a whole
// matrix of `whole`, in blocks of `block`, the shard's blocks where `map` puts them.
struct Nf4Shape {
    std::size_t count = 0, whole = 0, block = 64;
    bool double_quant = true;
    Nf4BlockMap map;

    std::size_t blocks() const { return (count + block - 1) / block; }
    // Bytes of each part: fp32 constants (the second-level scales of the whole matrix's blocks
    // and the mean, or the fp32 absmax), codes, int8 absmax codes. Their sum is
    // Nf4Tensor::bytes of the quantized shard.
    std::size_t float_bytes() const;
    std::size_t code_bytes() const { return (count + 1) / 2; }
    std::size_t absmax_code_bytes() const { return double_quant ? blocks() : 0; }
    std::size_t bytes() const { return float_bytes() + code_bytes() + absmax_code_bytes(); }
};

class Nf4Store {
public:
    using Range = std::pair<std::size_t, std::size_t>;  // [begin, end) in bytes

    Nf4Store() = default;
    // `groups[g]`: the shapes of group g's matrices, in order; matrix i is the i-th of them
    // all. Each group is padded to a multiple of `multiple` bytes.
    Nf4Store(const std::vector<std::vector<Nf4Shape>>& groups, std::size_t multiple);

    std::size_t bytes() const { return groups_.empty() ? 0 : groups_.back().second; }
    std::size_t size() const { return places_.size(); }  // matrices
    const std::vector<Range>& groups() const { return groups_; }
    std::size_t group_of(std::size_t i) const { return places_[i].group; }
    const Nf4Shape& shape(std::size_t i) const { return places_[i].shape; }

    // The bytes of every group (bytes()): `matrices` (quantized as the shapes say, in order)
    // in their places, the padding zero.
    std::vector<uint8_t> pack(std::span<const Nf4Tensor> matrices) const;
    // Matrix i as the op set reads it, its group's bytes starting at `group` (aligned as the
    // allocator aligns).
    Nf4Matrix view(std::size_t i, const uint8_t* group) const;

private:
    // Where a matrix's parts start in its group's bytes.
    struct Place {
        Nf4Shape shape;
        std::size_t group = 0, floats = 0, codes = 0, absmax_codes = 0;
    };
    std::vector<Range> groups_;
    std::vector<Place> places_;
};

}  // namespace trident::kernels
