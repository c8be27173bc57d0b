// The model's declared buffers (see buffer_spec.h).
#include "model/buffer_spec.h"

#include <algorithm>
#include <utility>

#include "kernels/error.h"

namespace trident::model {

int SetSpec::add(std::string name, std::size_t count, kernels::DType dtype, Keep keep) {
    buffers_.push_back(BufferSpec{std::move(name), count, dtype, keep});
    return static_cast<int>(buffers_.size()) - 1;
}

void SetSpec::make_deferrable(std::size_t from) {
    for (std::size_t i = from; i < buffers_.size(); ++i)
        if (buffers_[i].keep == Keep::split) buffers_[i].keep = Keep::deferrable;
}

bool KeepPolicy::in_set(Keep keep) const {
    switch (keep) {
        case Keep::always:
            return true;
        case Keep::unless_full:
            return recompute != Recompute::full;
        case Keep::unless_recompute:
            return recompute == Recompute::none;
        case Keep::split:
        case Keep::deferrable:
            break;
    }
    return split_backward;
}

bool KeepPolicy::in_scratch(Keep keep) const {
    if (keep == Keep::deferrable) return defer_attention && !split_backward;
    return (keep == Keep::unless_full || keep == Keep::unless_recompute) && !in_set(keep);
}

int ScratchSpec::add(const std::string& name, std::size_t count, kernels::DType dtype) {
    const auto it = std::find_if(buffers_.begin(), buffers_.end(),
                                 [&](const BufferSpec& b) { return b.name == name; });
    if (it == buffers_.end()) {
        buffers_.push_back(BufferSpec{name, count, dtype, Keep::always});
        return static_cast<int>(buffers_.size()) - 1;
    }
    if (it->dtype != dtype) throw Error("internal: scratch " + name + " asked for in two types");
    it->count = std::max(it->count, count);
    return static_cast<int>(it - buffers_.begin());
}

std::size_t ScratchSpec::bytes() const {
    std::size_t bytes = 0;
    for (const BufferSpec& b : buffers_) bytes += b.count * kernels::size_of(b.dtype);
    return bytes;
}

}  // namespace trident::model
