// Token + position embedding, forward and backward.
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int C) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const int t = bt % T;
        const float* wte_row = wte + static_cast<std::size_t>(tokens[bt]) * C;
        const float* wpe_row = wpe + static_cast<std::size_t>(t) * C;
        float* out_row = out + static_cast<std::size_t>(bt) * C;
        for (int c = 0; c < C; c++) out_row[c] = wte_row[c] + wpe_row[c];
    }
}

// dwte (Vp,C) += dout scattered by token; dwpe (T,C) += dout summed over the batch.
// Repeated tokens make the scatter a reduction, so threads split the channels, not the
// positions: every gradient element is summed by one thread in (b,t) order, deterministic
// and independent of the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int C) {
    constexpr int kBlock = 64;  // channels per task: whole cache lines, room to vectorise
    const int blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        const int c0 = block * kBlock;
        const int c1 = c0 + kBlock < C ? c0 + kBlock : C;
        for (int bt = 0; bt < B * T; bt++) {
            const int t = bt % T;
            const float* dout_row = dout + static_cast<std::size_t>(bt) * C;
            float* dwte_row = dwte + static_cast<std::size_t>(tokens[bt]) * C;
            float* dwpe_row = dwpe + static_cast<std::size_t>(t) * C;
            for (int c = c0; c < c1; c++) {
                dwte_row[c] += dout_row[c];
                dwpe_row[c] += dout_row[c];
            }
        }
    }
}

}  // namespace trident::kernels::cpu
