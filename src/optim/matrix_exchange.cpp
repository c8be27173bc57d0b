// The assembly of whole matrices and their split back (see matrix_exchange.h).
#include "optim/matrix_exchange.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/error.h"
#include "optim/owned_ranges.h"

namespace trident::optim {

namespace {

constexpr int kTag = 4601;  // the exchanges' point-to-point messages

}  // namespace

SteppingOrder stepping_order(const model::ParamLayout& layout, const Optimizer& optimizer) {
    SteppingOrder order;
    std::vector<const model::ParamTensor*> experts;
    for (const model::ParamTensor& t : layout.tensors())
        if (is_layer_matrix(layout, t))
            (layout.split_expert(t) ? experts : order.matrices).push_back(&t);
    const auto cost = [&](const model::ParamTensor* t) {
        return optimizer.matrix_step_flops(static_cast<std::size_t>(t->full_shape[0]),
                                           static_cast<std::size_t>(t->full_shape[1]));
    };
    const auto costlier = [&](const auto* a, const auto* b) { return cost(a) > cost(b); };
    std::stable_sort(order.matrices.begin(), order.matrices.end(), costlier);
    std::stable_sort(experts.begin(), experts.end(), costlier);
    order.experts = order.matrices.size();
    order.matrices.insert(order.matrices.end(), experts.begin(), experts.end());
    return order;
}

MatrixExchange::MatrixExchange(kernels::Ops& ops, const model::ParamLayout& layout,
                               const data_parallel::DataParallel& data_parallel,
                               parallel::Comm& tensor, const Optimizer& optimizer)
    : ops_(ops), data_parallel_(data_parallel), tensor_(tensor) {
    SteppingOrder order = stepping_order(layout, optimizer);
    matrices_ = std::move(order.matrices);
    experts_ = order.experts;
    names_.resize(matrices_.size());
    states_.resize(matrices_.size());
    for (std::size_t k = 0; k < matrices_.size(); ++k) {
        const model::ParamTensor& t = *matrices_[k];
        const bool owner =
            shard_of(k).rank() == shard_owner(k) && tensor_.rank() == tensor_owner(k);
        for (const MatrixStateDecl& d :
             optimizer.matrix_states(static_cast<std::size_t>(t.full_shape[0]),
                                     static_cast<std::size_t>(t.full_shape[1]))) {
            names_[k].push_back(d.name + "/" + t.name);
            if (!owner) continue;
            states_[k].emplace_back(ops, d.count);  // zero-filled
        }
    }
}

parallel::Comm& MatrixExchange::shard_of(std::size_t k) const {
    return k < experts_ ? data_parallel_.group() : data_parallel_.expert_group();
}

std::size_t MatrixExchange::place(std::size_t k) const {
    return k < experts_ ? k : k - experts_;
}

int MatrixExchange::shard_owner(std::size_t k) const {
    return static_cast<int>(place(k) % static_cast<std::size_t>(shard_of(k).size()));
}

int MatrixExchange::tensor_owner(std::size_t k) const {
    const auto shards = static_cast<std::size_t>(shard_of(k).size());
    return static_cast<int>(place(k) / shards % static_cast<std::size_t>(tensor_.size()));
}

void MatrixExchange::read(OptimizerState& s) const {
    for (std::size_t k = 0; k < states_.size(); ++k)
        for (std::size_t a = 0; a < states_[k].size(); ++a) {
            const kernels::DeviceBuffer& b = states_[k][a];
            std::vector<float>& to = s.matrices[names_[k][a]];
            to.resize(b.size());
            ops_.download(to.data(), b.f32(), b.size() * sizeof(float));
        }
}

std::map<std::string, std::size_t> MatrixExchange::held() const {
    std::map<std::string, std::size_t> held;
    for (std::size_t k = 0; k < states_.size(); ++k)
        for (std::size_t a = 0; a < states_[k].size(); ++a)
            held[names_[k][a]] = states_[k][a].size();
    return held;
}

void MatrixExchange::write(const OptimizerState& s, bool zero_missing) {
    for (std::size_t k = 0; k < states_.size(); ++k)
        for (std::size_t a = 0; a < states_[k].size(); ++a) {
            float* to = states_[k][a].f32();
            const std::size_t n = states_[k][a].size();
            const auto it = s.matrices.find(names_[k][a]);
            if (it == s.matrices.end() && zero_missing) {
                ops_.zero(states_[k][a].data(), n);
                continue;
            }
            if (it == s.matrices.end())
                throw Error("the checkpoint holds no \"" + names_[k][a] +
                            "\" (it was written by another optimizer)");
            if (it->second.size() != n)
                throw Error("the checkpoint's \"" + names_[k][a] + "\" holds " +
                            std::to_string(it->second.size()) + " elements, this run's " +
                            std::to_string(n) + " (another optimizer.galore.rank?)");
            ops_.upload(to, it->second.data(), n * sizeof(float));
        }
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

void MatrixExchange::sum_slices(parallel::Comm& shard, std::vector<float>& slice, int owner) const {
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

namespace {

// Tensor rank r's slice of matrix t into its place in the whole (rows × cols), or back.
void place_slice(const model::ParamTensor& t, int r, const float* slice, float* whole) {
    model::for_each_slice_run(t, r, [&](std::size_t local, std::size_t full, std::size_t n) {
        std::copy(slice + local, slice + local + n, whole + full);
    });
}
void take_slice(const model::ParamTensor& t, int r, const float* whole, float* slice) {
    model::for_each_slice_run(t, r, [&](std::size_t local, std::size_t full, std::size_t n) {
        std::copy(whole + full, whole + full + n, slice + local);
    });
}

}  // namespace

bool MatrixExchange::assemble(std::size_t k, const std::vector<float>& slice,
                              std::vector<float>& whole) const {
    const model::ParamTensor& t = *matrices_[k];
    const int owner = tensor_owner(k);
    if (tensor_.rank() != owner) {
        tensor_.send(slice.data(), slice.size(), owner, kTag);
        return false;
    }
    whole.resize(static_cast<std::size_t>(t.full_shape[0] * t.full_shape[1]));
    std::vector<float> other(slice.size());
    for (int r = 0; r < tensor_.size(); ++r) {
        if (r != owner) tensor_.recv(other.data(), other.size(), r, kTag);
        place_slice(t, r, (r == owner ? slice : other).data(), whole.data());
    }
    return true;
}

void MatrixExchange::split(std::size_t k, const std::vector<float>& whole,
                           std::vector<float>& slice) const {
    const model::ParamTensor& t = *matrices_[k];
    const int owner = tensor_owner(k);
    if (tensor_.rank() != owner) {
        tensor_.recv(slice.data(), slice.size(), owner, kTag);
        return;
    }
    for (int r = 0; r < tensor_.size(); ++r) {
        if (r == owner) continue;
        take_slice(t, r, whole.data(), slice.data());
        tensor_.send(slice.data(), slice.size(), r, kTag);
    }
    take_slice(t, owner, whole.data(), slice.data());
}

void MatrixExchange::step_whole(const Optimizer& optimizer, std::size_t k,
                                std::vector<float>& whole, const Hyper& h,
                                std::span<float> scratch) {
    const model::ParamTensor& t = *matrices_[k];
    // The matrix's state down to host memory for the step, and back up after it.
    std::vector<std::vector<float>> held(states_[k].size());
    std::vector<float*> state;
    for (std::size_t a = 0; a < held.size(); ++a) {
        held[a].resize(states_[k][a].size());
        ops_.download(held[a].data(), states_[k][a].f32(), held[a].size() * sizeof(float));
        state.push_back(held[a].data());
    }
    optimizer.matrix_step(ops_, whole.data(), static_cast<std::size_t>(t.full_shape[0]),
                          static_cast<std::size_t>(t.full_shape[1]), state, h, scratch);
    for (std::size_t a = 0; a < held.size(); ++a)
        ops_.upload(states_[k][a].f32(), held[a].data(), held[a].size() * sizeof(float));
}

void MatrixExchange::step(const Optimizer& optimizer, float* pieces, const Hyper& h,
                          std::span<float> scratch) {
    // The shard group's matrices, then the expert-shard group's, in rounds of S·M.
    for (const auto& [begin, end] :
         {std::pair{std::size_t{0}, experts_}, std::pair{experts_, matrices_.size()}}) {
        if (begin == end) continue;
        const std::size_t round = static_cast<std::size_t>(shard_of(begin).size()) *
                                  static_cast<std::size_t>(tensor_.size());
        for (std::size_t first = begin; first < end; first += round)
            step_round(optimizer, first, std::min(end, first + round), pieces, h, scratch);
    }
}

void MatrixExchange::step_round(const Optimizer& optimizer, std::size_t first, std::size_t end,
                                float* pieces, const Hyper& h, std::span<float> scratch) {
    parallel::Comm& shard = shard_of(first);  // alike for the round's matrices
    const bool sum = data_parallel_.zero_stage() >= 1 && shard.size() > 1;
    std::vector<std::vector<float>> slices(end - first);
    std::vector<float> whole;  // the one matrix of the round this rank steps, if any
    std::size_t mine = end;
    for (std::size_t k = first; k < end; ++k) {
        std::vector<float>& slice = slices[k - first];
        slice.resize(matrices_[k]->numel);
        gather_owned(*matrices_[k], pieces, slice.data());
        if (sum) sum_slices(shard, slice, shard_owner(k));
        if (shard.rank() == shard_owner(k) && assemble(k, slice, whole)) mine = k;
    }
    if (mine < end) step_whole(optimizer, mine, whole, h, scratch);
    for (std::size_t k = first; k < end; ++k) {
        std::vector<float>& slice = slices[k - first];
        if (shard.rank() == shard_owner(k)) split(k, whole, slice);
        if (shard.size() > 1) shard.broadcast(slice.data(), slice.size(), shard_owner(k));
        scatter_owned(*matrices_[k], slice.data(), pieces);
    }
}

}  // namespace trident::optim
