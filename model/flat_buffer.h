// The model's flat parameter or gradient buffer (model/param_layout.h) in device memory: whole,
// in one allocation, or sharded over the data-parallel group (ZeRO-2's gradients, ZeRO-3's
// parameters).
//
// Sharded, the buffer is cut into the layout's units (ParamLayout::units), each a multiple of
// its group's size D; replica r keeps the r-th D-th of every unit, and these parts, in unit
// order, make its shard (held always). A unit's group is the buffer's, or where the experts
// split (model/param_layout.h, expert_runs) a run of the experts held is a unit of its own,
// split over its group: the expert-shard ranks holding the same experts (UnitShards::experts). A
// unit's whole exists only while it is resident: allocated (zero-filled) when the data-parallel
// exchange gathers it for use or the backward starts adding gradients into it, released after
// (src/data_parallel/zero_units.h decides when). Element `offset` of the buffer is then reached
// through the resident unit holding it.
//
// Either way the buffer may leave out `gaps`, ranges no element of which is held (a 4-bit
// base's matrices, model/nf4_base.h): whole, the allocation holds the rest in order; sharded, a
// unit's whole holds its elements outside the gaps in order, padded to a multiple of D, and
// that is what its parts split.
//
// Sharded, the shard itself may be let go (ZeRO-3's parameters under
// optimizer.offload_params, src/data_parallel/param_file.h: it lives in a file then) and held
// again while something reads or writes it as a whole (a checkpoint's save or a resume).
//
// Buffer coordinates are the same either way, so the optimizer's ranges, the checkpoint's
// pieces and the model's offsets do not depend on how the buffer is held.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "kernels/ops.h"

namespace trident::model {

// How a sharded unit splits: over `replicas` ranks, this one `replica`; `experts`: they are
// the expert-shard group (a run of the experts held), not the buffer's group.
struct UnitShards {
    int replicas = 1, replica = 0;
    bool experts = false;
};

class FlatBuffer {
public:
    using Range = std::pair<std::size_t, std::size_t>;  // [begin, end) in the buffer

    FlatBuffer() = default;
    // Whole: `count` elements in one allocation, resident always, but for the `gaps` (sorted
    // ranges no element of which is held: a 4-bit base's matrices, model/nf4_base.h).
    FlatBuffer(kernels::Ops& ops, std::size_t count, kernels::DType dtype,
               std::vector<Range> gaps = {});
    // Sharded over `replicas` ranks, this rank `replica`: `units` cover the buffer in order,
    // each a multiple of `replicas` long (or, with `gaps`, padded to one past them).
    FlatBuffer(kernels::Ops& ops, std::vector<Range> units, int replicas, int replica,
               kernels::DType dtype, std::vector<Range> gaps = {});
    // The same, each unit split as its `shards` say (one per unit).
    FlatBuffer(kernels::Ops& ops, std::vector<Range> units, std::vector<UnitShards> shards,
               kernels::DType dtype, std::vector<Range> gaps = {});
    ~FlatBuffer();
    FlatBuffer(FlatBuffer&& other) noexcept;
    FlatBuffer& operator=(FlatBuffer&& other) noexcept;
    FlatBuffer(const FlatBuffer&) = delete;
    FlatBuffer& operator=(const FlatBuffer&) = delete;

    bool sharded() const { return !units_.empty(); }
    std::size_t size() const { return size_; }  // elements of the whole buffer
    kernels::DType dtype() const { return dtype_; }
    // Bytes held always: the whole buffer, or the shard (none while it is let go).
    std::size_t bytes() const { return shard_held() ? held_ * kernels::size_of(dtype_) : 0; }
    // Elements of the shard (the whole buffer when not sharded), held or not.
    std::size_t shard_size() const { return held_; }

    // Element `offset`: in the one allocation, or in the resident unit holding it (throws
    // when that unit is not resident, or the element lies in a gap).
    kernels::Ptr at(std::size_t offset) const;
    // What offsets add to: `base() + offset` is at(offset), so model code writes `w + p.qkv_w`.
    struct Base {
        const FlatBuffer* buffer;
        kernels::Ptr operator+(std::size_t offset) const { return buffer->at(offset); }
    };
    Base base() const { return Base{this}; }
    // This rank's own copy of element `offset` of a part it owns: at(offset) when whole, its
    // place in the shard when sharded (the element must lie in this replica's part of its unit).
    kernels::Ptr owned(std::size_t offset) const;

    // ---- units (sharded) ----------------------------------------------------------------
    const std::vector<Range>& units() const { return units_; }
    // The units overlapping [begin, end), as indices [first, last).
    std::pair<std::size_t, std::size_t> units_of(std::size_t begin, std::size_t end) const;
    std::size_t part_size(std::size_t u) const;  // elements of each replica's part of unit u
    const UnitShards& shards(std::size_t u) const { return shards_[u]; }
    bool resident(std::size_t u) const { return static_cast<bool>(whole_[u]); }
    kernels::Ptr unit(std::size_t u) const;        // the whole of a resident unit
    kernels::Ptr shard_part(std::size_t u) const;  // this replica's part of unit u, in the shard
    void acquire(std::size_t u);                   // allocates unit u's whole, zero-filled
    void release(std::size_t u);
    // The shard let go (its memory freed; shard_part, owned, to_host, from_host and zero
    // throw until it is held again) and held again (allocated, its contents undefined: the
    // holder fills it, through shard()).
    void let_go_shard();
    void hold_shard();
    bool shard_held() const { return static_cast<bool>(data_) || held_ == 0; }
    kernels::Ptr shard() const;  // the held shard, (shard_size()) elements in unit order

    // ---- the host ------------------------------------------------------------------------
    // What this rank holds, as fp32 in buffer order: every element when whole (the gaps
    // zero); when sharded, its parts in their places and zero elsewhere.
    std::vector<float> to_host() const;
    // The reverse, from a host buffer of the whole: every element, or this rank's parts.
    void from_host(const std::vector<float>& host);
    // Zero what is held (the whole, or the shard).
    void zero();

private:
    std::size_t unit_containing(std::size_t offset) const;
    // The elements of [begin, end) held (outside the gaps).
    std::size_t held_in(std::size_t begin, std::size_t end) const;
    // Where element `offset` lies in an allocation holding [begin, ...) past the gaps: the
    // elements held before it (throws when it lies in a gap).
    std::size_t held_index(std::size_t begin, std::size_t offset) const;
    // fn(offset, index, count) for each run of held elements of [begin, end), `index` counted
    // from `begin` as held_index counts.
    template <typename Fn>
    void for_each_held_run(std::size_t begin, std::size_t end, Fn fn) const;
    void check_gaps() const;
    // fn(offset, held, count) for each run of elements this rank holds always (the whole
    // buffer's, or its parts of the units), `held` where they lie.
    template <typename Fn>
    void for_each_owned_run(Fn fn) const;
    void free_all();

    kernels::Ops* ops_ = nullptr;
    kernels::DType dtype_ = kernels::DType::f32;
    std::size_t size_ = 0, held_ = 0;
    kernels::Ptr data_;  // the whole buffer, or the shard
    std::vector<Range> units_;
    std::vector<std::size_t> shard_offsets_;  // where each unit's part starts in the shard
    std::vector<std::size_t> unit_held_;      // each unit's whole: held elements, padded
    std::vector<kernels::Ptr> whole_;         // each unit's whole while resident
    std::vector<Range> gaps_;                 // the ranges not held
    std::vector<UnitShards> shards_;          // per unit
};

}  // namespace trident::model
