// A 4-bit frozen base (training.lora.quantize: nf4; QLoRA, Dettmers et al. 2023): every weight
// matrix of the transformer layers held as NF4 codes and constants (kernels/nf4.h) in one
// device buffer, and the GEMM policy that computes with them (model/gemm.h), dequantizing one
// linear's matrices at a time into one tile (Ops::nf4_dequantize) before the backend's matmul.
// docs/ARCHITECTURE.md, "Low-rank adapters".
//
// Quantization is a property of the whole matrix, never of the layout: each matrix is
// quantized whole (its blocks along its rows, output × input; the double quantization's mean and
// second-level blocks over all its absmax values) from the whole model's weights, and this rank
// keeps the codes and constants of its own slice, so every split dequantizes to the same bits.
// quant_block must divide each slice's rows (checked at start-up, src/config/validate.cpp).
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/nf4.h"
#include "kernels/nf4_store.h"
#include "model/gemm.h"
#include "model/param_layout.h"

namespace trident::model {

class Nf4Base final : public GemmPolicy {
public:
    Nf4Base(kernels::Ops& ops, std::size_t block, bool double_quant)
        : ops_(ops), block_(block), double_quant_(double_quant) {}

    // Quantizes each layer matrix `layout` (this rank's, tensor rank `tensor_rank`) holds from
    // `whole`, the whole model's weights as `whole_layout` lays them out, keeping this rank's
    // slice of each; the tile takes `dtype`, the parameters' type.
    void quantize(const ParamLayout& layout, int tensor_rank, const ParamLayout& whole_layout,
                  const std::vector<float>& whole, kernels::DType dtype);
    std::size_t block() const { return block_; }
    bool double_quant() const { return double_quant_; }
    // The device bytes of the codes and constants held (kernels::Nf4Tensor::bytes, summed),
    // and of the tile.
    std::size_t bytes() const { return store_.bytes(); }
    std::size_t parameters() const;  // the elements they stand for
    std::size_t tile_bytes() const { return tile_.bytes(); }
    // Writes each matrix dequantized, rounded to the parameters' type, into its place in
    // `local` (this rank's parameters on the host, which the buffer holds without them).
    void fill(std::vector<float>& local) const;

    void forward(PartContext& ctx, const LinearWeights& w, kernels::Ptr y, kernels::ConstPtr x,
                 int rows, bool bias) const override;
    void backward(PartContext& ctx, const LinearWeights& w, kernels::Ptr dx, bool weights,
                  kernels::ConstPtr dy, kernels::ConstPtr x, int rows) const override;

private:
    // Moves the host's quantized matrices (by offset in the layout) into store_ and matrices_.
    void store(const std::map<std::size_t, kernels::Nf4Tensor>& host);
    // The linear's W (out, in) dequantized into the tile, rounded to the parameters' type.
    kernels::ConstPtr dequantize_into_tile(const LinearWeights& w) const;

    kernels::Ops& ops_;
    std::size_t block_;
    bool double_quant_;
    kernels::Nf4Store store_;                             // every matrix's codes and constants
    std::map<std::size_t, kernels::Nf4Matrix> matrices_;  // store_'s, by offset in the layout
    kernels::DeviceBuffer tile_;                          // the largest linear's W on this rank
    // The W the tile holds (its offset; kNoParam: none). The base is frozen, so a linear
    // computed again (another block of rows, the backward) reuses it.
    mutable std::size_t tile_holds_ = kNoParam;
};

// The element ranges of `layout` that a 4-bit base holds as codes: its layer matrices, adjacent
// ones as one range (the parameter buffer leaves them out).
std::vector<std::pair<std::size_t, std::size_t>> quantized_ranges(const ParamLayout& layout);

// The bytes of the codes and constants (Nf4Base::bytes) of `layout`'s layer matrices in blocks
// of `block`, this rank's slices of the whole matrices: kernels::Nf4Tensor::bytes, counted.
std::size_t quantized_bytes(const ParamLayout& layout, std::size_t block, bool double_quant);

// Each layer matrix of `whole` (the whole model's weights, a buffer of `whole_layout`: M 1, one
// stage) replaced by its quantization's dequantized values: the base a 4-bit run trains on, as
// its exports, samples and merged weights hold it.
void round_trip_base(const ParamLayout& whole_layout, float* whole, std::size_t block,
                     bool double_quant);

}  // namespace trident::model
