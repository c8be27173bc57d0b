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
    : ops_(&ops), dtype_(dtype), size_(count), gaps_(std::move(gaps)) {
    check_gaps();
    held_ = held_in(0, size_);
    data_ = allocate(ops, held_, dtype);
}

void FlatBuffer::check_gaps() const {
    std::size_t end = 0;
    for (const auto& [begin, stop] : gaps_) {
        if (begin < end || stop < begin || stop > size_)
            throw Error("internal: a flat buffer's gaps must be sorted ranges within it");
        end = stop;
    }
}

std::size_t FlatBuffer::held_in(std::size_t begin, std::size_t end) const {
    std::size_t skipped = 0;
    for (const auto& [gap_begin, gap_end] : gaps_) {
        if (gap_begin >= end) break;
        if (gap_end > begin) skipped += std::min(gap_end, end) - std::max(gap_begin, begin);
    }
    return end - begin - skipped;
}

std::size_t FlatBuffer::held_index(std::size_t begin, std::size_t offset) const {
    for (const auto& [gap_begin, gap_end] : gaps_)
        if (offset >= gap_begin && offset < gap_end)
            throw Error("internal: element " + std::to_string(offset) +
                        " lies in a range the buffer does not hold");
    return held_in(begin, offset);
}

template <typename Fn>
void FlatBuffer::for_each_held_run(std::size_t begin, std::size_t end, Fn fn) const {
    std::size_t offset = begin, index = 0;
    for (const auto& [gap_begin, gap_end] : gaps_) {
        if (gap_end <= offset) continue;
        if (gap_begin >= end) break;
        if (gap_begin > offset) fn(offset, index, gap_begin - offset);
        index += gap_begin > offset ? gap_begin - offset : 0;
        offset = gap_end;
    }
    if (end > offset) fn(offset, index, end - offset);
}

FlatBuffer::FlatBuffer(kernels::Ops& ops, std::vector<Range> units, int replicas, int replica,
                       kernels::DType dtype, std::vector<Range> gaps)
    : FlatBuffer(ops, units, std::vector<UnitShards>(units.size(), UnitShards{replicas, replica}),
                 dtype, std::move(gaps)) {}

FlatBuffer::FlatBuffer(kernels::Ops& ops, std::vector<Range> units, std::vector<UnitShards> shards,
                       kernels::DType dtype, std::vector<Range> gaps)
    : ops_(&ops),
      dtype_(dtype),
      units_(std::move(units)),
      gaps_(std::move(gaps)),
      shards_(std::move(shards)) {
    if (shards_.size() != units_.size())
        throw Error("internal: a flat buffer's units and their shards differ in number");
    for (std::size_t u = 0; u < units_.size(); ++u) {
        const auto [begin, end] = units_[u];
        const auto D = static_cast<std::size_t>(shards_[u].replicas);
        if (begin != size_ || (gaps_.empty() && (end - begin) % D != 0))
            throw Error("internal: units must cover the buffer in order, each a multiple of " +
                        std::to_string(D) + " long");
        size_ = end;
    }
    check_gaps();
    for (std::size_t u = 0; u < units_.size(); ++u) {
        const auto [begin, end] = units_[u];
        const auto D = static_cast<std::size_t>(shards_[u].replicas);
        // The unit's elements outside the gaps, padded so that its parts split it evenly.
        unit_held_.push_back((held_in(begin, end) + D - 1) / D * D);
        shard_offsets_.push_back(held_);
        held_ += unit_held_.back() / D;
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
    unit_held_ = std::move(other.unit_held_);
    whole_ = std::move(other.whole_);
    gaps_ = std::move(other.gaps_);
    shards_ = std::move(other.shards_);
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
    if (!sharded()) return data_ + held_index(0, offset);
    const std::size_t u = unit_containing(offset);
    if (!whole_[u])
        throw Error("internal: element " + std::to_string(offset) + " of a sharded buffer read " +
                    "while its unit " + std::to_string(u) + " is not resident");
    return whole_[u] + held_index(units_[u].first, offset);
}

kernels::Ptr FlatBuffer::owned(std::size_t offset) const {
    if (!sharded()) return data_ + held_index(0, offset);
    const std::size_t u = unit_containing(offset);
    const std::size_t part = part_size(u);
    const std::size_t mine = static_cast<std::size_t>(shards_[u].replica) * part;
    const std::size_t index = held_index(units_[u].first, offset);
    if (index < mine || index >= mine + part)
        throw Error("internal: element " + std::to_string(offset) + " is not this replica's");
    return shard() + (shard_offsets_[u] + (index - mine));
}

std::pair<std::size_t, std::size_t> FlatBuffer::units_of(std::size_t begin, std::size_t end) const {
    if (begin >= end) return {0, 0};
    return {unit_containing(begin), unit_containing(end - 1) + 1};
}

std::size_t FlatBuffer::part_size(std::size_t u) const {
    return unit_held_[u] / static_cast<std::size_t>(shards_[u].replicas);
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
    whole_[u] = allocate(*ops_, unit_held_[u], dtype_);
}

void FlatBuffer::release(std::size_t u) {
    if (whole_[u]) ops_->release(whole_[u].data);
    whole_[u] = kernels::Ptr(nullptr, dtype_);
}

template <typename Fn>
void FlatBuffer::for_each_owned_run(Fn fn) const {
    if (!sharded()) {
        for_each_held_run(0, size_, [&](std::size_t offset, std::size_t index, std::size_t count) {
            fn(offset, data_ + index, count);
        });
        return;
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
        const std::size_t part = part_size(u),
                          mine = static_cast<std::size_t>(shards_[u].replica) * part;
        const auto [begin, end] = units_[u];
        for_each_held_run(begin, end,
                          [&](std::size_t offset, std::size_t index, std::size_t count) {
                              const std::size_t lo = std::max(index, mine),
                                                hi = std::min(index + count, mine + part);
                              if (lo < hi)
                                  fn(offset + (lo - index), shard_part(u) + (lo - mine), hi - lo);
                          });
    }
}

std::vector<float> FlatBuffer::to_host() const {
    std::vector<float> host(size_, 0.0f);
    for_each_owned_run([&](std::size_t offset, kernels::Ptr held, std::size_t count) {
        ops_->copy_to_host(host.data() + offset, held, count);
    });
    return host;
}

void FlatBuffer::from_host(const std::vector<float>& host) {
    if (sharded() && host.size() < size_)
        throw Error("internal: " + std::to_string(host.size()) + " values for a buffer of " +
                    std::to_string(size_));
    for_each_owned_run([&](std::size_t offset, kernels::Ptr held, std::size_t count) {
        if (offset < host.size())
            ops_->copy_from_host(held, host.data() + offset, std::min(count, host.size() - offset));
    });
}

void FlatBuffer::zero() {
    if (held_) ops_->zero(shard(), held_);
}

}  // namespace trident::model
