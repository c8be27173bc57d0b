// The quantized matrices in device memory (see nf4_store.h).
#include "kernels/nf4_store.h"

#include <type_traits>

namespace trident::kernels {

namespace {

// Bytes of each part of the buffer: fp32 constants, codes, int8 absmax codes.
struct Parts {
    std::size_t floats = 0, codes = 0, absmax_q = 0;
    explicit Parts(std::span<const Nf4Tensor> matrices) {
        for (const Nf4Tensor& m : matrices) {
            floats += 4 * (m.double_quant() ? m.absmax_scale.size() + 1 : m.absmax.size());
            codes += m.codes.size();
            absmax_q += m.absmax_q.size();
        }
    }
};

}  // namespace

Nf4Store::Nf4Store(Ops& ops, std::span<const Nf4Tensor> matrices) {
    const Parts parts(matrices);
    buffer_ = DeviceBuffer(ops, parts.floats + parts.codes + parts.absmax_q, DType::u8);
    auto* const base = static_cast<uint8_t*>(buffer_.data().data);
    std::size_t at[3] = {0, parts.floats, parts.floats + parts.codes};  // each part's next byte
    // Uploads `values` to the next bytes of `part`; returns where they went.
    const auto put = [&](int part, const auto& values) {
        using T = std::remove_cvref_t<decltype(values[0])>;
        void* device = base + at[part];
        const std::size_t bytes = values.size() * sizeof(T);
        if (bytes) ops.upload(device, values.data(), bytes);
        at[part] += bytes;
        return static_cast<const T*>(device);
    };
    for (const Nf4Tensor& m : matrices) {
        Nf4Matrix view{.count = m.size, .block = m.block, .map = m.map};
        if (m.double_quant()) {
            view.absmax_mean = put(0, std::vector<float>{m.absmax_mean});
            view.absmax_scale = put(0, m.absmax_scale);
            view.absmax_q = put(2, m.absmax_q);
        } else {
            view.absmax = put(0, m.absmax);
        }
        view.codes = put(1, m.codes);
        views_.push_back(view);
    }
}

}  // namespace trident::kernels
