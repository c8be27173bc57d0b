// DeviceBuffer (see device_buffer.h).
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

}  // namespace trident::kernels
