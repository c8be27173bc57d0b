// The 4-bit frozen base's dequantization (Ops::nf4_dequantize): each block's absmax, then each
// element's code-book value times it, in fp32 as kernels/nf4.cpp's reference computes it.
#include "kernels/nf4.h"

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

void nf4_dequantize(float* out, const Nf4Matrix& m) {
    const std::size_t blocks = (m.count + m.block - 1) / m.block;
#pragma omp parallel for schedule(static)
    for (std::size_t b = 0; b < blocks; ++b) {
        const float a =
            m.absmax ? m.absmax[b]
                     : nf4_absmax(m.absmax_q[b], m.absmax_scale[m.map.whole(b) / kNf4AbsmaxBlock],
                                  *m.absmax_mean);
        const std::size_t end = std::min((b + 1) * m.block, m.count);
        for (std::size_t i = b * m.block; i < end; ++i)
            out[i] = kNf4Codes[(m.codes[i / 2] >> (4 * (i % 2))) & 0xF] * a;
    }
}

}  // namespace trident::kernels::cpu
