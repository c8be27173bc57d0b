// Nf4Store: quantized matrices (kernels/nf4.h) in the backend's memory, as the op set reads
// them (kernels::Nf4Matrix, Ops::nf4_dequantize): one device buffer holding all the matrices'
// fp32 constants, then all their codes, then all their int8 absmax codes, so that each part is
// aligned without padding and the buffer's bytes are the format's (Nf4Tensor::bytes, summed).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kernels/device_buffer.h"
#include "kernels/nf4.h"

namespace trident::kernels {

class Nf4Store {
public:
    Nf4Store() = default;
    // Uploads `matrices` (a shard's map goes with it).
    Nf4Store(Ops& ops, std::span<const Nf4Tensor> matrices);

    std::size_t bytes() const { return buffer_.bytes(); }
    std::size_t size() const { return views_.size(); }
    // Matrix i as the op set reads it.
    const Nf4Matrix& operator[](std::size_t i) const { return views_[i]; }

private:
    DeviceBuffer buffer_;  // bytes
    std::vector<Nf4Matrix> views_;
};

}  // namespace trident::kernels
