// The owned ranges of the trainable buffer (see owned_ranges.h).
#include "optim/owned_ranges.h"

#include <algorithm>

namespace trident::optim {

std::vector<OwnedRange> owned_ranges(const model::ParamLayout& layout,
                                     const std::vector<data_parallel::OwnedPart>& owned) {
    std::vector<OwnedRange> ranges;
    for (const auto& t : layout.tensors()) {
        const bool counted = !layout.held_elsewhere(t);
        for (const data_parallel::OwnedPart& o : owned) {
            // The part of the tensor that this rank owns in this part.
            const std::size_t lo = std::max(t.offset, o.offset);
            const std::size_t hi = std::min(t.offset + t.numel, o.offset + o.count);
            if (lo >= hi) continue;
            const std::size_t state = o.state + (lo - o.offset);
            OwnedRange* last = ranges.empty() ? nullptr : &ranges.back();
            if (last && last->decay == t.decay && last->counted == counted &&
                last->trains == t.trains && last->offset + last->count == lo &&
                last->state + last->count == state)
                last->count += hi - lo;
            else
                ranges.push_back(OwnedRange{lo, hi - lo, state, t.decay, counted, t.trains});
        }
    }
    return ranges;
}

}  // namespace trident::optim
