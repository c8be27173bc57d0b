// DeviceBuffer: a buffer of the backend's memory (kernels::Ops::allocate) that releases
// itself, for the model's parameters, gradients, activations and scratch; HostBuffer: the
// same for the host memory the device copies to and from (Ops::allocate_host).
#pragma once

#include <cstddef>

#include "kernels/ops.h"

namespace trident::kernels {

// A device buffer of `count` elements of one type that releases itself.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(Ops& ops, std::size_t count, DType dtype = DType::f32);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    Ptr data() const { return data_; }
    float* f32() const { return data_.f32(); }  // an fp32 buffer's floats
    std::size_t size() const { return count_; }
    std::size_t bytes() const { return count_ * kernels::size_of(data_.dtype); }

private:
    Ops* ops_ = nullptr;
    Ptr data_;
    std::size_t count_ = 0;
};

// `bytes` of host memory from Ops::allocate_host (page-locked on a GPU), zero-filled, that
// releases itself.
class HostBuffer {
public:
    HostBuffer() = default;
    HostBuffer(Ops& ops, std::size_t bytes);
    ~HostBuffer();
    HostBuffer(HostBuffer&& other) noexcept;
    HostBuffer& operator=(HostBuffer&& other) noexcept;
    HostBuffer(const HostBuffer&) = delete;
    HostBuffer& operator=(const HostBuffer&) = delete;

    template <typename T>
    T* as() const {
        return static_cast<T*>(data_);
    }
    std::size_t bytes() const { return bytes_; }

private:
    Ops* ops_ = nullptr;
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
};

}  // namespace trident::kernels
