// The model's shared scratch and the work deferred to the next exchange (see part_context.h).
#include "model/part_context.h"

#include <utility>

#include "kernels/error.h"

namespace trident::model {

Scratch::Scratch(kernels::Ops& ops, const std::vector<BufferSpec>& spec) {
    buffers_.reserve(spec.size());
    for (const BufferSpec& b : spec) buffers_.emplace_back(ops, b.count, b.dtype);
}

void Deferred::set(std::function<void()> work) {
    if (work_) throw Error("internal: deferred work set while other work waits");
    work_ = std::move(work);
}

void Deferred::run() {
    if (!work_) return;
    const std::function<void()> work = std::move(work_);
    work_ = nullptr;
    work();
}

}  // namespace trident::model
