// DeviceAllocator: device memory for the GPU backend, cached so that a training step never
// calls cudaMalloc or cudaFree once the first step has run.
//
// cudaMalloc and cudaFree synchronise the whole device and cost tens of microseconds to
// milliseconds each; a step allocates and releases the same activation and scratch sizes
// every time. Blocks are kept by size class when released and handed out again for a request
// of the same class. All compute runs on one compute stream (device.h), so a block released
// after the last op that uses it was queued is safe to hand to the next op queued; where a
// collective on a communication stream may still use it, release makes the compute stream
// wait for that first (stream_uses.h).
//
// Counting: allocated = bytes of the blocks in use (class sizes), peak = its maximum;
// reserved also counts the cached free blocks. When cudaMalloc runs out, the cache is
// returned to the driver and the allocation retried once; then the error names the sizes.
#pragma once

#include <cstddef>
#include <map>
#include <unordered_map>
#include <vector>

namespace trident::kernels::cuda {

class DeviceAllocator {
public:
    DeviceAllocator() = default;
    ~DeviceAllocator();
    DeviceAllocator(const DeviceAllocator&) = delete;
    DeviceAllocator& operator=(const DeviceAllocator&) = delete;

    // At least `bytes` bytes, 256-byte aligned; not cleared. 0 bytes gives nullptr.
    void* allocate(std::size_t bytes);
    // A pointer from allocate (nullptr is ignored); the block goes back to the cache.
    void release(void* block);

    std::size_t allocated_bytes() const { return allocated_; }
    std::size_t peak_allocated_bytes() const { return peak_; }
    // Starts the peak again from what is allocated now.
    void reset_peak() { peak_ = allocated_; }

    // The class a request of `bytes` is served from: 512-byte steps up to 1 MiB, then steps
    // of 1/8 of the power of two below (at most 12.5% unused).
    static std::size_t size_class(std::size_t bytes);

private:
    void free_cached();

    std::unordered_map<void*, std::size_t> in_use_;     // block -> class size
    std::map<std::size_t, std::vector<void*>> cached_;  // class size -> free blocks
    std::size_t allocated_ = 0, peak_ = 0;
};

// Device scratch for one op, back to the cache when the op is queued (the next user of the
// block is queued after it on the one compute stream).
class Scratch {
public:
    Scratch(DeviceAllocator& allocator, std::size_t bytes)
        : allocator_(allocator), data_(allocator.allocate(bytes)) {}
    ~Scratch() { allocator_.release(data_); }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    void* data() const { return data_; }
    float* floats() const { return static_cast<float*>(data_); }

private:
    DeviceAllocator& allocator_;
    void* data_;
};

}  // namespace trident::kernels::cuda
