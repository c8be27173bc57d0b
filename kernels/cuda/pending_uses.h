// PendingUses: which ranges of device memory work on another stream may still read or write,
// each until its event (stream_uses.h keeps the process's, with CUDA events). The bookkeeping
// alone, over any event type, so that the CPU tests check it (tests/test_pending_uses.cpp).
//
// A use is forgotten once its event has happened, or once a stream that every later user of
// the memory follows has been made to wait for it: from then on nothing can reach the memory
// before the use is done.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace trident::kernels::cuda {

template <typename Event>
class PendingUses {
public:
    // Notes that [data, data + bytes) is in use until `done`; uses whose events have happened
    // (happened(event) is true) are forgotten first.
    template <typename Happened>
    void add(const void* data, std::size_t bytes, Event done, Happened happened) {
        forget_happened(happened);
        if (bytes == 0) return;
        const auto begin = reinterpret_cast<std::uintptr_t>(data);
        uses_.push_back({begin, begin + bytes, std::move(done)});
    }

    // Before [data, data + bytes) is used again: wait(event) for every use overlapping it that
    // has not happened; those uses and every use that has happened are forgotten.
    template <typename Happened, typename Wait>
    void before_reuse(const void* data, std::size_t bytes, Happened happened, Wait wait) {
        const auto begin = reinterpret_cast<std::uintptr_t>(data), end = begin + bytes;
        std::size_t kept = 0;
        for (std::size_t i = 0; i < uses_.size(); ++i) {
            Use& use = uses_[i];
            if (happened(use.done)) continue;
            if (use.begin < end && begin < use.end) {
                wait(use.done);
                continue;
            }
            if (kept != i) uses_[kept] = std::move(use);
            ++kept;
        }
        uses_.erase(uses_.begin() + static_cast<std::ptrdiff_t>(kept), uses_.end());
    }

    bool empty() const { return uses_.empty(); }
    std::size_t size() const { return uses_.size(); }

private:
    struct Use {
        std::uintptr_t begin, end;
        Event done;
    };

    template <typename Happened>
    void forget_happened(Happened happened) {
        std::size_t kept = 0;
        for (std::size_t i = 0; i < uses_.size(); ++i) {
            if (happened(uses_[i].done)) continue;
            if (kept != i) uses_[kept] = std::move(uses_[i]);
            ++kept;
        }
        uses_.erase(uses_.begin() + static_cast<std::ptrdiff_t>(kept), uses_.end());
    }

    std::vector<Use> uses_;
};

}  // namespace trident::kernels::cuda
