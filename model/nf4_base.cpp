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

// The layer matrices of `layout` and where their bytes lie (quantized_store): each matrix's
// name and offset in store order, and each group's range in the layout.
struct MatrixPlaces {
    std::vector<std::vector<kernels::Nf4Shape>> groups;
    std::vector<const ParamTensor*> matrices;
    std::vector<UnitRange> group_units;
};

MatrixPlaces place(const ParamLayout& layout, int tensor_rank, std::size_t block, bool double_quant,
                   bool by_unit) {
    MatrixPlaces p;
    // Whole: one group over the layout. Sharded: one per unit holding matrices.
    std::vector<UnitRange> ranges{{0, layout.total()}};
    if (by_unit) {
        ranges.clear();
        for (const Unit& u : layout.units()) ranges.emplace_back(u.begin, u.end);
    }
    for (const UnitRange& range : ranges) {
        std::vector<kernels::Nf4Shape> group;
        for (const ParamTensor& t : layout.tensors()) {
            if (!layer_matrix(layout, t) || t.offset < range.first || t.offset >= range.second)
                continue;
            std::size_t whole = 1;
            for (int64_t d : t.full_shape) whole *= static_cast<std::size_t>(d);
            group.push_back(kernels::Nf4Shape{t.numel, whole, block, double_quant,
                                              block_map(t, tensor_rank, block)});
            p.matrices.push_back(&t);
        }
        if (group.empty()) continue;
        p.groups.push_back(std::move(group));
        p.group_units.push_back(range);
    }
    return p;
}

}  // namespace

kernels::Nf4Store quantized_store(const ParamLayout& layout, std::size_t block, bool double_quant,
                                  const BufferPlan& plan) {
    return kernels::Nf4Store(place(layout, 0, block, double_quant, plan.shard_params).groups,
                             plan.shard_params ? plan.multiple : 1);
}

Nf4Base::Nf4Base(kernels::Ops& ops, const ParamLayout& layout, int tensor_rank, std::size_t block,
                 bool double_quant, const BufferPlan& plan)
    : ops_(ops), block_(block), double_quant_(double_quant), replica_(plan.replica) {
    const MatrixPlaces p = place(layout, tensor_rank, block, double_quant, plan.shard_params);
    const std::size_t multiple = plan.shard_params ? plan.multiple : 1;
    store_ = kernels::Nf4Store(p.groups, multiple);
    group_units_ = p.group_units;
    for (std::size_t i = 0; i < p.matrices.size(); ++i) {
        names_.push_back(p.matrices[i]->name);
        matrices_.emplace(p.matrices[i]->offset, i);
    }
    codes_ = plan.shard_params ? FlatBuffer(ops, store_.groups(), static_cast<int>(multiple),
                                            plan.replica, kernels::DType::u8)
                               : FlatBuffer(ops, store_.bytes(), kernels::DType::u8);
}

void Nf4Base::quantize(const ParamLayout& whole_layout, const std::vector<float>& whole,
                       kernels::DType dtype) {
    std::vector<kernels::Nf4Tensor> shards;
    for (std::size_t i = 0; i < store_.size(); ++i) {
        const ParamTensor* full = whole_layout.find(names_[i]);
        if (!full) throw Error("internal: " + names_[i] + " is not in the whole model");
        const std::span<const float> values(whole.data() + full->offset, full->numel);
        const kernels::Nf4Shape& shape = store_.shape(i);
        shards.push_back(kernels::nf4_shard(kernels::nf4_quantize(values, block_, double_quant_),
                                            shape.map, shape.count / block_));
    }
    const std::vector<uint8_t> bytes = store_.pack(shards);
    if (!codes_.sharded() && !bytes.empty())
        ops_.upload(codes_.at(0).data, bytes.data(), bytes.size());
    for (std::size_t g = 0; codes_.sharded() && g < codes_.units().size(); ++g) {
        const std::size_t part = codes_.part_size(g);
        ops_.upload(
            codes_.shard_part(g).data,
            bytes.data() + codes_.units()[g].first + static_cast<std::size_t>(replica_) * part,
            part);
    }
    // A linear's W spans adjacent matrices (llama's q, k and v; gate and up): the tile holds
    // the largest run of adjacent ones.
    std::size_t largest = 0, run = 0, end = 0;
    for (const auto& [offset, i] : matrices_) {
        const std::size_t count = store_.shape(i).count;
        run = offset == end ? run + count : count;
        end = offset + count;
        largest = std::max(largest, run);
    }
    tile_ = kernels::DeviceBuffer(ops_, largest, dtype);
    tile_holds_ = kNoParam;
}

UnitRange Nf4Base::codes_of(UnitRange elements) const {
    if (!codes_.sharded()) return {0, 0};
    UnitRange bytes{0, 0};
    for (std::size_t g = 0; g < group_units_.size(); ++g) {
        if (group_units_[g].first < elements.first || group_units_[g].second > elements.second)
            continue;
        if (bytes.first == bytes.second) bytes.first = codes_.units()[g].first;
        bytes.second = codes_.units()[g].second;
    }
    return bytes;
}

kernels::Nf4Matrix Nf4Base::matrix(std::size_t i) const {
    const std::size_t group_begin = store_.groups()[store_.group_of(i)].first;
    return store_.view(i, static_cast<const uint8_t*>(codes_.at(group_begin).data));
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
    for (std::size_t i = 0; i < store_.size(); ++i) total += store_.shape(i).count;
    return total;
}

void Nf4Base::fill(std::vector<float>& local, UnitRange elements) const {
    for (const auto& [offset, i] : matrices_) {
        if (offset < elements.first || offset >= elements.second) continue;
        const std::size_t count = store_.shape(i).count;
        ops_.nf4_dequantize(tile_.data(), matrix(i));
        ops_.copy_to_host(local.data() + offset, tile_.data(), count);
    }
    tile_holds_ = kNoParam;
}

ConstPtr Nf4Base::dequantize_into_tile(const LinearWeights& w) const {
    const std::size_t count = static_cast<std::size_t>(w.out) * static_cast<std::size_t>(w.in);
    if (count > tile_.size()) throw Error("internal: a linear larger than the NF4 tile");
    for (std::size_t done = 0; tile_holds_ != w.weight && done < count;) {
        const auto it = matrices_.find(w.weight + done);
        if (it == matrices_.end() || done + store_.shape(it->second).count > count)
            throw Error("internal: no quantized matrix at element " +
                        std::to_string(w.weight + done));
        ops_.nf4_dequantize(tile_.data() + done, matrix(it->second));
        done += store_.shape(it->second).count;
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
