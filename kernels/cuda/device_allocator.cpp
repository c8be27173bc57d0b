// The caching device allocator (see device_allocator.h).
#include "kernels/cuda/device_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdio>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/stream_uses.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

std::string mebibytes(std::size_t bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return text;
}

}  // namespace

DeviceAllocator::~DeviceAllocator() {
    // At exit nothing may throw; a failing cudaFree (driver shutting down) is ignored.
    for (auto& [block, size] : in_use_) cudaFree(block);
    for (auto& [size, blocks] : cached_)
        for (void* block : blocks) cudaFree(block);
}

std::size_t DeviceAllocator::size_class(std::size_t bytes) {
    constexpr std::size_t kSmallStep = 512, kSmallLimit = std::size_t{1} << 20;
    if (bytes <= kSmallLimit) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
    const std::size_t step = std::bit_floor(bytes) / 8;
    return (bytes + step - 1) / step * step;
}

void* DeviceAllocator::allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    const std::size_t size = size_class(bytes);
    void* block = nullptr;
    auto cached = cached_.find(size);
    if (cached != cached_.end() && !cached->second.empty()) {
        block = cached->second.back();
        cached->second.pop_back();
    } else {
        cudaError_t status = cudaMalloc(&block, size);
        if (status == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            free_cached();
            status = cudaMalloc(&block, size);
        }
        if (status != cudaSuccess) {
            cudaGetLastError();
            std::size_t free = 0, total = 0;
            cudaMemGetInfo(&free, &total);
            throw Error("GPU out of memory allocating " + mebibytes(size) + " (in use " +
                        mebibytes(allocated_) + ", free on the device " + mebibytes(free) + " of " +
                        mebibytes(total) + "); try a smaller training.micro_batch, " +
                        "training.recompute, or more pipeline/tensor ranks");
        }
    }
    in_use_[block] = size;
    allocated_ += size;
    peak_ = std::max(peak_, allocated_);
    return block;
}

void DeviceAllocator::release(void* block) {
    if (block == nullptr) return;
    const auto it = in_use_.find(block);
    if (it == in_use_.end()) throw Error("internal: releasing a device block not allocated here");
    // A collective on another stream may still use the block (stream_uses.h): what is queued
    // on it from now on waits for that.
    await_stream_uses(block, it->second);
    allocated_ -= it->second;
    cached_[it->second].push_back(block);
    in_use_.erase(it);
}

void DeviceAllocator::free_cached() {
    // cudaFree waits for the device, so no queued kernel still uses a block freed here.
    for (auto& [size, blocks] : cached_) {
        for (void* block : blocks) TRIDENT_CUDA_CHECK(cudaFree(block));
        blocks.clear();
    }
}

}  // namespace trident::kernels::cuda
