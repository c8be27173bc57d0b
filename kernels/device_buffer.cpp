// DeviceBuffer and HostBuffer (see device_buffer.h).
#include "kernels/device_buffer.h"

#include <utility>

namespace trident::kernels {

// A buffer of nothing holds no memory (the allocator would round it up to its alignment),
// so the bytes counted are those of buffers in use.
DeviceBuffer::DeviceBuffer(Ops& ops, std::size_t count, DType dtype)
    : ops_(&ops), data_(count ? ops.allocate(count, dtype) : Ptr(nullptr, dtype)), count_(count) {}

DeviceBuffer::~DeviceBuffer() {
    if (data_) ops_->release(data_.data);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ops_(other.ops_),
      data_(std::exchange(other.data_, Ptr())),
      count_(std::exchange(other.count_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        if (data_) ops_->release(data_.data);
        ops_ = other.ops_;
        data_ = std::exchange(other.data_, Ptr());
        count_ = std::exchange(other.count_, 0);
    }
    return *this;
}

HostBuffer::HostBuffer(Ops& ops, std::size_t bytes)
    : ops_(&ops), data_(ops.allocate_host(bytes)), bytes_(bytes) {}

HostBuffer::~HostBuffer() {
    if (data_) ops_->release_host(data_);
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : ops_(other.ops_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
        if (data_) ops_->release_host(data_);
        ops_ = other.ops_;
        data_ = std::exchange(other.data_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
}

}  // namespace trident::kernels
