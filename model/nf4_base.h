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
//
// The bytes (kernels::Nf4Store) are held whole, or at ZeRO-3 (BufferPlan::shard_params) in one
// group per unit of the layout (a layer's matrices), each padded to a multiple of the shard
// group's size and sharded over it as the frozen parameters are (a FlatBuffer of bytes): this
// rank keeps its share of every layer's bytes, and the data-parallel module gathers a layer's
// whole bytes on the same unit events as its parameters and releases them after use
// (src/data_parallel/data_parallel.h). Dequantization reads the gathered bytes as it reads the
// whole ones, so every stage computes with the same bits.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/nf4.h"
#include "kernels/nf4_store.h"
#include "model/flat_buffer.h"
#include "model/gemm.h"
#include "model/model_units.h"
#include "model/param_layout.h"

namespace trident::model {

class Nf4Base final : public GemmPolicy {
public:
    // The layer matrices `layout` holds (tensor rank `tensor_rank`) in blocks of `block`, their
    // bytes held as `plan` holds the parameters: whole, or sharded by units.
    Nf4Base(kernels::Ops& ops, const ParamLayout& layout, int tensor_rank, std::size_t block,
            bool double_quant, const BufferPlan& plan);

    // Quantizes each matrix from `whole`, the whole model's weights as `whole_layout` lays
    // them out, keeping this rank's slice (and share) of each; the tile takes `dtype`, the
    // parameters' type.
    void quantize(const ParamLayout& whole_layout, const std::vector<float>& whole,
                  kernels::DType dtype);
    std::size_t block() const { return block_; }
    bool double_quant() const { return double_quant_; }
    // The device bytes of the codes and constants held always (kernels::Nf4Tensor::bytes,
    // summed; sharded: this rank's share of each unit's, padded), and of the tile.
    std::size_t bytes() const { return codes_.bytes(); }
    std::size_t parameters() const;  // the elements they stand for
    std::size_t tile_bytes() const { return tile_.bytes(); }
    // The bytes, sharded by units at ZeRO-3: what the data-parallel module gathers.
    FlatBuffer& codes() { return codes_; }
    // The range of codes() holding the matrices of the layout's range `elements` (a unit's):
    // empty unless they are a group of their own.
    UnitRange codes_of(UnitRange elements) const;
    // Writes each matrix of the layout's range `elements` dequantized, rounded to the
    // parameters' type, into its place in `local` (this rank's parameters on the host, which
    // the buffer holds without them). Their bytes must be resident (sharded: gathered).
    void fill(std::vector<float>& local, UnitRange elements = {0, SIZE_MAX}) const;

    void forward(PartContext& ctx, const LinearWeights& w, kernels::Ptr y, kernels::ConstPtr x,
                 int rows, bool bias) const override;
    void backward(PartContext& ctx, const LinearWeights& w, kernels::Ptr dx, bool weights,
                  kernels::ConstPtr dy, kernels::ConstPtr x, int rows) const override;

private:
    // Matrix i (store_'s) as the op set reads it, from its group's resident bytes.
    kernels::Nf4Matrix matrix(std::size_t i) const;
    // The linear's W (out, in) dequantized into the tile, rounded to the parameters' type.
    kernels::ConstPtr dequantize_into_tile(const LinearWeights& w) const;

    kernels::Ops& ops_;
    std::size_t block_;
    bool double_quant_;
    int replica_;                                  // this rank's share of a sharded group
    std::vector<std::string> names_;               // of store_'s matrices, in order
    std::vector<UnitRange> group_units_;           // each group's range in the layout
    kernels::Nf4Store store_;                      // where every matrix's codes and constants lie
    FlatBuffer codes_;                             // store_'s bytes (u8), whole or sharded by group
    std::map<std::size_t, std::size_t> matrices_;  // store_'s index, by offset in the layout
    kernels::DeviceBuffer tile_;                   // the largest linear's W on this rank
    // The W the tile holds (its offset; kNoParam: none). The base is frozen, so a linear
    // computed again (another block of rows, the backward) reuses it.
    mutable std::size_t tile_holds_ = kNoParam;
};

// The element ranges of `layout` that a 4-bit base holds as codes: its layer matrices, adjacent
// ones as one range (the parameter buffer leaves them out).
std::vector<std::pair<std::size_t, std::size_t>> quantized_ranges(const ParamLayout& layout);

// Where the codes and constants of `layout`'s layer matrices (this rank's slices of the whole
// matrices, in blocks of `block`) lie as Nf4Base holds them under `plan`: one group, or one per
// unit of the layout padded to a multiple of plan.multiple when the parameters are sharded.
// Its bytes() / plan.multiple (sharded) or bytes() (whole) are Nf4Base::bytes, counted.
kernels::Nf4Store quantized_store(const ParamLayout& layout, std::size_t block, bool double_quant,
                                  const BufferPlan& plan);

// Each layer matrix of `whole` (the whole model's weights, a buffer of `whole_layout`: M 1, one
// stage) replaced by its quantization's dequantized values: the base a 4-bit run trains on, as
// its exports, samples and merged weights hold it.
void round_trip_base(const ParamLayout& whole_layout, float* whole, std::size_t block,
                     bool double_quant);

}  // namespace trident::model
