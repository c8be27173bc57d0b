// The 4-bit frozen base and its GEMM policy (see nf4_base.h).
#include "model/nf4_base.h"

#include <algorithm>

#include "kernels/error.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

// Whether `t` is a weight matrix of a transformer layer: two-dimensional, and neither the
// embedding's nor the head's (which stay as they are), nor the last stage's copy of a tied
// token embedding (in neither range).
bool layer_matrix(const ParamLayout& layout, const ParamTensor& t) {
    const auto in = [&](std::pair<std::size_t, std::size_t> r) {
        return t.offset >= r.first && t.offset < r.second;
    };
    return t.shape.size() == 2 && t.name != layout.wte_name() && !in(layout.embedding_range()) &&
           !in(layout.head_range());
}

// Where this rank's slice of `t` lies in the whole matrix, in blocks: runs of rows or columns
// of one length, one stride apart (for_each_slice_run), each starting and ending on a block.
kernels::Nf4BlockMap block_map(const ParamTensor& t, int tensor_rank, std::size_t block) {
    kernels::Nf4BlockMap map;
    std::size_t runs = 0;
    for_each_slice_run(t, tensor_rank, [&](std::size_t local, std::size_t full, std::size_t n) {
        if (local % block || full % block || n % block)
            throw Error("training.lora.quant_block (" + std::to_string(block) +
                        ") must divide the rows of " + t.name + " on each tensor rank");
        if (runs == 0) map = {n / block, 0, full / block};
        if (runs == 1) map.stride = full / block - map.first;
        if (n / block != map.period || local / block != runs * map.period ||
            full / block != map.whole(local / block))
            throw Error("internal: " + t.name + "'s slice is not evenly strided");
        ++runs;
    });
    return map;
}

}  // namespace

void Nf4Base::quantize(const ParamLayout& layout, int tensor_rank, const ParamLayout& whole_layout,
                       const std::vector<float>& whole, kernels::DType dtype) {
    std::map<std::size_t, kernels::Nf4Tensor> host;
    std::size_t largest = 0;
    for (const ParamTensor& t : layout.tensors()) {
        if (!layer_matrix(layout, t)) continue;
        const ParamTensor* full = whole_layout.find(t.name);
        if (!full) throw Error("internal: " + t.name + " is not in the whole model");
        const std::span<const float> values(whole.data() + full->offset, full->numel);
        const kernels::Nf4Tensor matrix = kernels::nf4_quantize(values, block_, double_quant_);
        host.emplace(t.offset, kernels::nf4_shard(matrix, block_map(t, tensor_rank, block_),
                                                  t.numel / block_));
        largest = std::max(largest, t.numel);
    }
    // A linear's W spans adjacent matrices (llama's q, k and v; gate and up): the tile holds
    // the largest run of adjacent ones.
    std::size_t run = 0, end = 0;
    for (const auto& [offset, m] : host) {
        run = offset == end ? run + m.size : m.size;
        end = offset + m.size;
        largest = std::max(largest, run);
    }
    store(host);
    tile_ = kernels::DeviceBuffer(ops_, largest, dtype);
    tile_holds_ = kNoParam;
}

void Nf4Base::store(const std::map<std::size_t, kernels::Nf4Tensor>& host) {
    std::vector<kernels::Nf4Tensor> matrices;
    for (const auto& [offset, m] : host) matrices.push_back(m);
    store_ = kernels::Nf4Store(ops_, matrices);
    matrices_.clear();
    std::size_t i = 0;
    for (const auto& [offset, m] : host) matrices_.emplace(offset, store_[i++]);
}

std::vector<std::pair<std::size_t, std::size_t>> quantized_ranges(const ParamLayout& layout) {
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    for (const ParamTensor& t : layout.tensors()) {
        if (!layer_matrix(layout, t)) continue;
        if (!ranges.empty() && ranges.back().second == t.offset)
            ranges.back().second += t.numel;
        else
            ranges.emplace_back(t.offset, t.offset + t.numel);
    }
    return ranges;
}

std::size_t quantized_bytes(const ParamLayout& layout, std::size_t block, bool double_quant) {
    std::size_t bytes = 0;
    for (const ParamTensor& t : layout.tensors()) {
        if (!layer_matrix(layout, t)) continue;
        std::size_t whole = 1;
        for (int64_t d : t.full_shape) whole *= static_cast<std::size_t>(d);
        const std::size_t blocks = t.numel / block, whole_blocks = (whole + block - 1) / block;
        const std::size_t scales =
            (whole_blocks + kernels::kNf4AbsmaxBlock - 1) / kernels::kNf4AbsmaxBlock;
        bytes += (t.numel + 1) / 2 + (double_quant ? blocks + 4 * scales + 4 : 4 * blocks);
    }
    return bytes;
}

void round_trip_base(const ParamLayout& whole_layout, float* whole, std::size_t block,
                     bool double_quant) {
    for (const ParamTensor& t : whole_layout.tensors()) {
        if (!layer_matrix(whole_layout, t)) continue;
        const std::span<float> values(whole + t.offset, t.numel);
        kernels::nf4_dequantize(kernels::nf4_quantize(values, block, double_quant), values);
    }
}

std::size_t Nf4Base::parameters() const {
    std::size_t total = 0;
    for (const auto& [offset, m] : matrices_) total += m.count;
    return total;
}

void Nf4Base::fill(std::vector<float>& local) const {
    for (const auto& [offset, m] : matrices_) {
        ops_.nf4_dequantize(tile_.data(), m);
        ops_.copy_to_host(local.data() + offset, tile_.data(), m.count);
    }
    tile_holds_ = kNoParam;
}

ConstPtr Nf4Base::dequantize_into_tile(const LinearWeights& w) const {
    const std::size_t count = static_cast<std::size_t>(w.out) * static_cast<std::size_t>(w.in);
    if (count > tile_.size()) throw Error("internal: a linear larger than the NF4 tile");
    for (std::size_t done = 0; tile_holds_ != w.weight && done < count;) {
        const auto it = matrices_.find(w.weight + done);
        if (it == matrices_.end() || done + it->second.count > count)
            throw Error("internal: no quantized matrix at element " +
                        std::to_string(w.weight + done));
        ops_.nf4_dequantize(tile_.data() + done, it->second);
        done += it->second.count;
        if (done == count) tile_holds_ = w.weight;
    }
    return tile_.data();
}

void Nf4Base::forward(PartContext& ctx, const LinearWeights& w, Ptr y, ConstPtr x, int rows,
                      bool bias) const {
    const FlatBuffer& params = ctx.weights.params;
    const ConstPtr b = bias && w.bias != kNoParam ? ConstPtr(params.at(w.bias)) : ConstPtr();
    ctx.ops.matmul_forward(y, x, dequantize_into_tile(w), b, rows, w.in, w.out);
}

// The base is frozen: only the input's gradient, through the dequantized W.
void Nf4Base::backward(PartContext& ctx, const LinearWeights& w, Ptr dx, bool weights, ConstPtr dy,
                       ConstPtr x, int rows) const {
    if (weights) throw Error("internal: a weight gradient of the 4-bit frozen base");
    if (!dx) return;
    ctx.ops.matmul_backward(dx, Ptr(nullptr, tile_.data().dtype), Ptr(nullptr, tile_.data().dtype),
                            dy, x, dequantize_into_tile(w), rows, w.in, w.out);
}

}  // namespace trident::model
