// The assembly of whole matrices and their split back (see matrix_exchange.h).
#include "optim/matrix_exchange.h"

#include <algorithm>

#include "optim/owned_ranges.h"

namespace trident::optim {

namespace {

constexpr int kTag = 4601;  // the exchanges' point-to-point messages

}  // namespace

MatrixExchange::MatrixExchange(const model::ParamLayout& layout,
                               const data_parallel::DataParallel& data_parallel,
                               parallel::Comm& tensor)
    : data_parallel_(data_parallel), tensor_(tensor) {
    for (const model::ParamTensor& t : layout.tensors())
        if (is_layer_matrix(layout, t)) matrices_.push_back(&t);
}

void MatrixExchange::gather_owned(const model::ParamTensor& t, const float* pieces,
                                  float* slice) const {
    std::fill(slice, slice + t.numel, 0.0f);
    for (const data_parallel::OwnedPart& o : data_parallel_.owned()) {
        const std::size_t lo = std::max(t.offset, o.offset);
        const std::size_t hi = std::min(t.offset + t.numel, o.offset + o.count);
        if (lo < hi)
            std::copy(pieces + o.state + (lo - o.offset), pieces + o.state + (hi - o.offset),
                      slice + (lo - t.offset));
    }
}

void MatrixExchange::scatter_owned(const model::ParamTensor& t, const float* slice,
                                   float* pieces) const {
    for (const data_parallel::OwnedPart& o : data_parallel_.owned()) {
        const std::size_t lo = std::max(t.offset, o.offset);
        const std::size_t hi = std::min(t.offset + t.numel, o.offset + o.count);
        if (lo < hi)
            std::copy(slice + (lo - t.offset), slice + (hi - t.offset),
                      pieces + o.state + (lo - o.offset));
    }
}

void MatrixExchange::sum_slices(std::vector<float>& slice, int owner) const {
    parallel::Comm& shard = data_parallel_.group();
    if (shard.rank() != owner) {
        shard.send(slice.data(), slice.size(), owner, kTag);
        return;
    }
    std::vector<float> other(slice.size());
    for (int r = 0; r < shard.size(); ++r) {
        if (r == owner) continue;
        shard.recv(other.data(), other.size(), r, kTag);
        for (std::size_t i = 0; i < slice.size(); ++i) slice[i] += other[i];
    }
}

void MatrixExchange::step_whole(const Optimizer& optimizer, const model::ParamTensor& t,
                                std::vector<float>& slice, int owner) const {
    if (tensor_.rank() != owner) {
        tensor_.send(slice.data(), slice.size(), owner, kTag);
        tensor_.recv(slice.data(), slice.size(), owner, kTag);
        return;
    }
    const auto rows = static_cast<std::size_t>(t.full_shape[0]);
    const auto cols = static_cast<std::size_t>(t.full_shape[1]);
    std::vector<float> whole(rows * cols), other(slice.size());
    // Tensor rank r's slice into its place in the whole, and back.
    const auto place = [&](const std::vector<float>& from, int r) {
        model::for_each_slice_run(t, r, [&](std::size_t local, std::size_t full, std::size_t n) {
            std::copy(from.begin() + static_cast<std::ptrdiff_t>(local),
                      from.begin() + static_cast<std::ptrdiff_t>(local + n),
                      whole.begin() + static_cast<std::ptrdiff_t>(full));
        });
    };
    const auto take = [&](std::vector<float>& to, int r) {
        model::for_each_slice_run(t, r, [&](std::size_t local, std::size_t full, std::size_t n) {
            std::copy(whole.begin() + static_cast<std::ptrdiff_t>(full),
                      whole.begin() + static_cast<std::ptrdiff_t>(full + n),
                      to.begin() + static_cast<std::ptrdiff_t>(local));
        });
    };
    for (int r = 0; r < tensor_.size(); ++r) {
        if (r != owner) tensor_.recv(other.data(), other.size(), r, kTag);
        place(r == owner ? slice : other, r);
    }
    optimizer.matrix_step(whole.data(), rows, cols);
    for (int r = 0; r < tensor_.size(); ++r) {
        if (r == owner) continue;
        take(other, r);
        tensor_.send(other.data(), other.size(), r, kTag);
    }
    take(slice, owner);
}

void MatrixExchange::step(const Optimizer& optimizer, float* pieces) const {
    parallel::Comm& shard = data_parallel_.group();
    const auto shards = static_cast<std::size_t>(shard.size());
    const auto tensors = static_cast<std::size_t>(tensor_.size());
    const bool sharded = data_parallel_.zero_stage() >= 1;
    for (std::size_t k = 0; k < matrices_.size(); ++k) {
        const model::ParamTensor& t = *matrices_[k];
        const auto shard_owner = static_cast<int>(k % shards);
        const auto tensor_owner = static_cast<int>(k / shards % tensors);
        std::vector<float> slice(t.numel);
        gather_owned(t, pieces, slice.data());
        if (sharded && shards > 1) sum_slices(slice, shard_owner);
        if (shard.rank() == shard_owner) step_whole(optimizer, t, slice, tensor_owner);
        if (shards > 1) shard.broadcast(slice.data(), slice.size(), shard_owner);
        scatter_owned(t, slice.data(), pieces);
    }
}

}  // namespace trident::optim
