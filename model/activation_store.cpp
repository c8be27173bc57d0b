// Activation sets, their pool and the recompute scratch (see activation_store.h).
#include "model/activation_store.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/error.h"

namespace trident::model {

using kernels::DeviceBuffer;
using kernels::Ptr;

namespace {

// The buffers of `spec` that `where` keeps; empty ones for the others, so slots index them.
template <typename Where>
std::vector<DeviceBuffer> allocate_spec(kernels::Ops& ops, const SetSpec& spec, Where where) {
    std::vector<DeviceBuffer> buffers;
    buffers.reserve(spec.buffers().size());
    for (const BufferSpec& b : spec.buffers())
        buffers.push_back(where(b.keep) ? DeviceBuffer(ops, b.count, b.dtype)
                                        : DeviceBuffer(ops, 0, b.dtype));
    return buffers;
}

// Where each of `layer`'s buffers rebuilt into the recompute scratch starts, in bytes from
// the scratch's start, each at a 64-byte boundary; last, the bytes in all.
std::vector<std::size_t> scratch_offsets(const SetSpec& layer, const KeepPolicy& policy) {
    constexpr std::size_t kAlign = 64;
    std::vector<std::size_t> at;
    std::size_t end = 0;
    for (const BufferSpec& b : layer.buffers()) {
        at.push_back(end);
        if (policy.in_scratch(b.keep))
            end += (b.count * kernels::size_of(b.dtype) + kAlign - 1) / kAlign * kAlign;
    }
    at.push_back(end);
    return at;
}

}  // namespace

WeightGradStash::WeightGradStash(SetSpec& set, std::string name, std::size_t count,
                                 kernels::DType dtype)
    : slot_(set.add(std::move(name), count, dtype, Keep::split)), count_(count) {}

void WeightGradStash::keep(PartContext& ctx, const Pass& pass, BackwardPart part,
                           kernels::ConstPtr value) const {
    if (part == BackwardPart::input && slot_ >= 0) ctx.ops.copy(pass.buffers[slot_], value, count_);
}

std::size_t set_bytes(const ChunkSpec& chunk, const KeepPolicy& policy) {
    std::size_t bytes = spec_bytes(chunk.own, [&](Keep k) { return own_in_set(k, policy); });
    for (const SetSpec* layer : chunk.layers)
        bytes += spec_bytes(*layer, [&](Keep k) { return policy.in_set(k); });
    return bytes;
}

std::size_t recompute_scratch_bytes(const std::vector<const SetSpec*>& layers,
                                    const KeepPolicy& policy) {
    std::size_t bytes = 0;
    for (const SetSpec* layer : layers)
        bytes = std::max(bytes, scratch_offsets(*layer, policy).back());
    return bytes;
}

ActivationStore::ActivationStore(kernels::Ops& ops, const KeepPolicy& policy,
                                 std::vector<ChunkSpec> chunks)
    : ops_(ops), policy_(policy), chunks_(std::move(chunks)), pool_(chunks_.size()) {
    std::vector<const SetSpec*> layers;
    for (const ChunkSpec& chunk : chunks_)
        layers.insert(layers.end(), chunk.layers.begin(), chunk.layers.end());
    const std::size_t bytes = recompute_scratch_bytes(layers, policy_);
    if (bytes > 0) scratch_ = DeviceBuffer(ops, bytes, kernels::DType::i8);
    char* const base = static_cast<char*>(scratch_.data().data);
    for (const ChunkSpec& chunk : chunks_) {
        auto& slots = scratch_slots_.emplace_back();
        for (const SetSpec* layer : chunk.layers) {
            const std::vector<std::size_t> at = scratch_offsets(*layer, policy_);
            auto& ptrs = slots.emplace_back();
            for (std::size_t s = 0; s < layer->buffers().size(); ++s) {
                const BufferSpec& b = layer->buffers()[s];
                ptrs.push_back(policy_.in_scratch(b.keep) && base ? Ptr(base + at[s], b.dtype)
                                                                  : Ptr());
            }
        }
    }
}

std::unique_ptr<ActivationStore::Set> ActivationStore::allocate(int c) {
    const ChunkSpec& chunk = chunks_[static_cast<std::size_t>(c)];
    const std::size_t before = ops_.allocated_bytes();
    auto set = std::make_unique<Set>();
    set->own = allocate_spec(ops_, chunk.own, [&](Keep k) { return own_in_set(k, policy_); });
    for (const SetSpec* layer : chunk.layers)
        set->layers.push_back(
            allocate_spec(ops_, *layer, [&](Keep k) { return policy_.in_set(k); }));
    bytes_ += ops_.allocated_bytes() - before;
    return set;
}

ActivationStore::Set& ActivationStore::start(int mb, int c) {
    auto& pool = pool_[static_cast<std::size_t>(c)];
    std::unique_ptr<Set> set;
    if (pool.empty()) {
        set = allocate(c);
    } else {
        set = std::move(pool.back());
        pool.pop_back();
    }
    auto [it, fresh] = live_.emplace(std::pair{mb, c}, std::move(set));
    if (!fresh)
        throw Error("internal: microbatch " + std::to_string(mb) + " of chunk " +
                    std::to_string(c) + " is already in flight");
    return *it->second;
}

ActivationStore::Set& ActivationStore::live(int mb, int c) {
    const auto it = live_.find({mb, c});
    if (it == live_.end())
        throw Error("internal: no forward of microbatch " + std::to_string(mb) + " on chunk " +
                    std::to_string(c) + " to run backward on");
    return *it->second;
}

void ActivationStore::release(int mb, int c) {
    const auto it = live_.find({mb, c});
    pool_[static_cast<std::size_t>(c)].push_back(std::move(it->second));
    live_.erase(it);
}

std::size_t ActivationStore::sets() const {
    std::size_t n = live_.size();
    for (const auto& pool : pool_) n += pool.size();
    return n;
}

SetBuffers ActivationStore::own(const Set& set) const {
    std::vector<Ptr> buffers;
    for (const DeviceBuffer& b : set.own) buffers.push_back(b.data());
    return SetBuffers(std::move(buffers));
}

SetBuffers ActivationStore::layer(const Set& set, int c, int i) const {
    const SetSpec& spec = *chunks_[static_cast<std::size_t>(c)].layers[static_cast<std::size_t>(i)];
    const std::vector<DeviceBuffer>& kept = set.layers[static_cast<std::size_t>(i)];
    std::vector<Ptr> buffers;
    for (std::size_t s = 0; s < kept.size(); ++s)
        buffers.push_back(
            policy_.in_scratch(spec.buffers()[s].keep)
                ? scratch_slots_[static_cast<std::size_t>(c)][static_cast<std::size_t>(i)][s]
                : kept[s].data());
    return SetBuffers(std::move(buffers));
}

}  // namespace trident::model
