// The model's flat buffers, whole or sharded by units (see flat_buffer.h).
#include "model/flat_buffer.h"

#include <algorithm>
#include <string>
#include <utility>

#include "kernels/error.h"

namespace trident::model {

namespace {

// A buffer of nothing holds no memory (the allocator would round it up to its alignment).
kernels::Ptr allocate(kernels::Ops& ops, std::size_t count, kernels::DType dtype) {
    return count ? ops.allocate(count, dtype) : kernels::Ptr(nullptr, dtype);
}

}  // namespace

FlatBuffer::FlatBuffer(kernels::Ops& ops, std::size_t count, kernels::DType dtype,
                       std::vector<Range> gaps)
    : ops_(&ops), dtype_(dtype), size_(count), held_(count), gaps_(std::move(gaps)) {
    std::size_t end = 0;
    for (const auto& [begin, stop] : gaps_) {
        if (begin < end || stop < begin || stop > count)
            throw Error("internal: a flat buffer's gaps must be sorted ranges within it");
        held_ -= stop - begin;
        end = stop;
    }
    data_ = allocate(ops, held_, dtype);
}

std::size_t FlatBuffer::held_index(std::size_t offset) const {
    std::size_t skipped = 0;
    for (const auto& [begin, end] : gaps_) {
        if (offset < begin) break;
        if (offset < end)
            throw Error("internal: element " + std::to_string(offset) +
                        " lies in a range the buffer does not hold");
        skipped += end - begin;
    }
    return offset - skipped;
}

template <typename Fn>
void FlatBuffer::for_each_held_run(Fn fn) const {
    std::size_t offset = 0, index = 0;
    for (const auto& [begin, end] : gaps_) {
        if (begin > offset) fn(offset, index, begin - offset);
        index += begin - offset;
        offset = end;
    }
    if (size_ > offset) fn(offset, index, size_ - offset);
}

FlatBuffer::FlatBuffer(kernels::Ops& ops, std::vector<Range> units, int replicas, int replica,
                       kernels::DType dtype)
    : ops_(&ops), dtype_(dtype), units_(std::move(units)), replicas_(replicas), replica_(replica) {
    for (const auto& [begin, end] : units_) {
        if (begin != size_ || (end - begin) % static_cast<std::size_t>(replicas) != 0)
            throw Error("internal: units must cover the buffer in order, each a multiple of " +
                        std::to_string(replicas) + " long");
        shard_offsets_.push_back(held_);
        held_ += (end - begin) / static_cast<std::size_t>(replicas);
        size_ = end;
    }
    whole_.assign(units_.size(), kernels::Ptr(nullptr, dtype));
    data_ = allocate(ops, held_, dtype);
}

FlatBuffer::~FlatBuffer() {
    free_all();
}

void FlatBuffer::free_all() {
    if (!ops_) return;
    for (const kernels::Ptr& w : whole_)
        if (w) ops_->release(w.data);
    if (data_) ops_->release(data_.data);
}

FlatBuffer::FlatBuffer(FlatBuffer&& other) noexcept {
    *this = std::move(other);
}

FlatBuffer& FlatBuffer::operator=(FlatBuffer&& other) noexcept {
    if (this == &other) return *this;
    free_all();
    ops_ = std::exchange(other.ops_, nullptr);
    dtype_ = other.dtype_;
    size_ = std::exchange(other.size_, 0);
    held_ = std::exchange(other.held_, 0);
    data_ = std::exchange(other.data_, kernels::Ptr());
    units_ = std::move(other.units_);
    shard_offsets_ = std::move(other.shard_offsets_);
    whole_ = std::move(other.whole_);
    gaps_ = std::move(other.gaps_);
    replicas_ = other.replicas_;
    replica_ = other.replica_;
    return *this;
}

std::size_t FlatBuffer::unit_containing(std::size_t offset) const {
    const auto it = std::upper_bound(units_.begin(), units_.end(), offset,
                                     [](std::size_t x, const Range& u) { return x < u.second; });
    if (it == units_.end())
        throw Error("internal: element " + std::to_string(offset) + " past a buffer of " +
                    std::to_string(size_));
    return static_cast<std::size_t>(it - units_.begin());
}

kernels::Ptr FlatBuffer::at(std::size_t offset) const {
    if (!sharded()) return data_ + held_index(offset);
    const std::size_t u = unit_containing(offset);
    if (!whole_[u])
        throw Error("internal: element " + std::to_string(offset) + " of a sharded buffer read " +
                    "while its unit " + std::to_string(u) + " is not resident");
    return whole_[u] + (offset - units_[u].first);
}

kernels::Ptr FlatBuffer::owned(std::size_t offset) const {
    if (!sharded()) return data_ + held_index(offset);
    const std::size_t u = unit_containing(offset);
    const std::size_t part = part_size(u);
    const std::size_t mine = units_[u].first + static_cast<std::size_t>(replica_) * part;
    if (offset < mine || offset >= mine + part)
        throw Error("internal: element " + std::to_string(offset) + " is not this replica's");
    return shard() + (shard_offsets_[u] + (offset - mine));
}

std::pair<std::size_t, std::size_t> FlatBuffer::units_of(std::size_t begin, std::size_t end) const {
    if (begin >= end) return {0, 0};
    return {unit_containing(begin), unit_containing(end - 1) + 1};
}

std::size_t FlatBuffer::part_size(std::size_t u) const {
    return (units_[u].second - units_[u].first) / static_cast<std::size_t>(replicas_);
}

kernels::Ptr FlatBuffer::unit(std::size_t u) const {
    if (!whole_[u]) throw Error("internal: unit " + std::to_string(u) + " is not resident");
    return whole_[u];
}

kernels::Ptr FlatBuffer::shard_part(std::size_t u) const {
    return shard() + shard_offsets_[u];
}

kernels::Ptr FlatBuffer::shard() const {
    if (!shard_held()) throw Error("internal: the shard is read while it is let go");
    return data_;
}

void FlatBuffer::let_go_shard() {
    if (!sharded()) throw Error("internal: only a sharded buffer lets its shard go");
    if (data_) ops_->release(data_.data);
    data_ = kernels::Ptr(nullptr, dtype_);
}

void FlatBuffer::hold_shard() {
    if (!data_) data_ = allocate(*ops_, held_, dtype_);
}

void FlatBuffer::acquire(std::size_t u) {
    if (whole_[u]) throw Error("internal: unit " + std::to_string(u) + " is already resident");
    whole_[u] = allocate(*ops_, units_[u].second - units_[u].first, dtype_);
}

void FlatBuffer::release(std::size_t u) {
    if (whole_[u]) ops_->release(whole_[u].data);
    whole_[u] = kernels::Ptr(nullptr, dtype_);
}

std::vector<float> FlatBuffer::to_host() const {
    std::vector<float> host(size_, 0.0f);
    if (!sharded()) {
        for_each_held_run([&](std::size_t offset, std::size_t index, std::size_t count) {
            ops_->copy_to_host(host.data() + offset, data_ + index, count);
        });
        return host;
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
        const std::size_t part = part_size(u);
        ops_->copy_to_host(
            host.data() + units_[u].first + static_cast<std::size_t>(replica_) * part,
            shard_part(u), part);
    }
    return host;
}

void FlatBuffer::from_host(const std::vector<float>& host) {
    if (sharded() && host.size() < size_)
        throw Error("internal: " + std::to_string(host.size()) + " values for a buffer of " +
                    std::to_string(size_));
    if (!sharded()) {
        for_each_held_run([&](std::size_t offset, std::size_t index, std::size_t count) {
            if (offset < host.size())
                ops_->copy_from_host(data_ + index, host.data() + offset,
                                     std::min(count, host.size() - offset));
        });
        return;
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
        const std::size_t part = part_size(u);
        ops_->copy_from_host(
            shard_part(u),
            host.data() + units_[u].first + static_cast<std::size_t>(replica_) * part, part);
    }
}

void FlatBuffer::zero() {
    if (held_) ops_->zero(shard(), held_);
}

}  // namespace trident::model
