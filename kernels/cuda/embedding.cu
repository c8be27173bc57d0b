// Token + position embedding on one rank's slice of the vocabulary, forward and backward
// (shapes in kernels/ops.h: a token outside [vocab_begin, vocab_begin + vocab_local) looks up
// a zero row here, its row lives on another tensor-parallel rank; row t of a sequence is at
// position positions[t], or t without positions).
//
// Backward without atomics: the warp of position i works only if i is the first position of
// its token; it then walks the later positions in order (32 token ids per step, a ballot
// picks the matches) and sums their gradient rows, in registers, 256 channels at a time. The
// leader test scans the earlier positions, O(N^2/32) comparisons in the worst case (all
// tokens distinct), cheap next to the row traffic for a microbatch of some thousand tokens.
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kChannelsPerLane = 8;  // registers per lane for a token's running sums

__device__ __forceinline__ int local_row(int32_t token, int vocab_begin, int vocab_local) {
    const int row = token - vocab_begin;
    return row >= 0 && row < vocab_local ? row : -1;
}

// out (B*T, C): one block per row.
__device__ __forceinline__ int position_of(const int32_t* positions, int t) {
    return positions ? positions[t] : t;
}

template <typename E>
__global__ void embedding_forward_kernel(E* out, const int32_t* tokens, const E* wte, const E* wpe,
                                         int T, int C, int vocab_begin, int vocab_local,
                                         const int32_t* positions) {
    const int bt = blockIdx.x;
    const int row = local_row(tokens[bt], vocab_begin, vocab_local);
    const E* wte_row = row >= 0 ? wte + static_cast<std::size_t>(row) * C : nullptr;
    const E* wpe_row = wpe != nullptr
                           ? wpe + static_cast<std::size_t>(position_of(positions, bt % T)) * C
                           : nullptr;
    E* out_row = out + static_cast<std::size_t>(bt) * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float x = wte_row ? to_float(wte_row[c]) : 0.0f;
        if (wpe_row) x += to_float(wpe_row[c]);
        out_row[c] = from_float<E>(x);
    }
}

// dwte (vocab_local, C) += dout rows summed per token, one warp per position.
template <typename E>
__global__ void embedding_backward_wte_kernel(Ptr dwte, const E* dout, const int32_t* tokens, int N,
                                              int C, int vocab_begin, int vocab_local) {
    const int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (i >= N) return;
    const int32_t token = tokens[i];
    const int row = local_row(token, vocab_begin, vocab_local);
    if (row < 0) return;
    // Lead only the first position of this token.
    for (int base = 0; base < i; base += 32) {
        const int j = base + lane;
        if (__any_sync(0xffffffffu, j < i && tokens[j] == token)) return;
    }
    const std::size_t row_begin = static_cast<std::size_t>(row) * C;
    for (int c0 = 0; c0 < C; c0 += 32 * kChannelsPerLane) {
        float sum[kChannelsPerLane] = {};
        for (int base = i; base < N; base += 32) {
            const int j = base + lane;
            unsigned matches = __ballot_sync(0xffffffffu, j < N && tokens[j] == token);
            while (matches) {
                const int k = base + __ffs(matches) - 1;
                matches &= matches - 1;
                const E* dout_row = dout + static_cast<std::size_t>(k) * C;
#pragma unroll
                for (int r = 0; r < kChannelsPerLane; ++r) {
                    const int c = c0 + r * 32 + lane;
                    if (c < C) sum[r] += to_float(dout_row[c]);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < kChannelsPerLane; ++r) {
            const int c = c0 + r * 32 + lane;
            if (c < C) {
                const std::size_t i = row_begin + c;
                store_from_float(dwte.data, dwte.dtype, i,
                                 load_as_float(dwte.data, dwte.dtype, i) + sum[r]);
            }
        }
    }
}

// dwpe at the T rows' positions += dout summed over the batch, in batch order: one thread per
// element (the positions are distinct).
template <typename E>
__global__ void embedding_backward_wpe_kernel(Ptr dwpe, const E* dout, int B, int T, int C,
                                              const int32_t* positions) {
    const std::size_t TC = static_cast<std::size_t>(T) * C;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < TC;
         i += stride) {
        float sum = 0.0f;
        for (int b = 0; b < B; ++b) sum += to_float(dout[b * TC + i]);
        const int t = static_cast<int>(i / C);
        const std::size_t at = static_cast<std::size_t>(position_of(positions, t)) * C + i % C;
        store_from_float(dwpe.data, dwpe.dtype, at, load_as_float(dwpe.data, dwpe.dtype, at) + sum);
    }
}

}  // namespace

template <typename E>
void embedding_forward(E* out, const int32_t* tokens, const E* wte, const E* wpe, int B, int T,
                       int C, int vocab_begin, int vocab_local, const int32_t* positions,
                       cudaStream_t stream) {
    if (B * T == 0) return;
    embedding_forward_kernel<<<B * T, kThreads, 0, stream>>>(out, tokens, wte, wpe, T, C,
                                                             vocab_begin, vocab_local, positions);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template <typename E>
void embedding_backward(Ptr dwte, Ptr dwpe, const E* dout, const int32_t* tokens, int B, int T,
                        int C, int vocab_begin, int vocab_local, const int32_t* positions,
                        cudaStream_t stream) {
    const int N = B * T;
    if (N == 0) return;
    require_float_elements(dwte.dtype, "a token embedding gradient");
    if (dwpe) require_float_elements(dwpe.dtype, "a position embedding gradient");
    embedding_backward_wte_kernel<<<(N + kWarpsPerBlock - 1) / kWarpsPerBlock, kThreads, 0,
                                    stream>>>(dwte, dout, tokens, N, C, vocab_begin, vocab_local);
    TRIDENT_CUDA_CHECK_LAUNCH();
    if (dwpe.data != nullptr) {
        embedding_backward_wpe_kernel<<<blocks_for(static_cast<std::size_t>(T) * C, kThreads),
                                        kThreads, 0, stream>>>(dwpe, dout, B, T, C, positions);
        TRIDENT_CUDA_CHECK_LAUNCH();
    }
}

#define TRIDENT_INSTANTIATE(E)                                                                     \
    template void embedding_forward<E>(E*, const int32_t*, const E*, const E*, int, int, int, int, \
                                       int, const int32_t*, cudaStream_t);                         \
    template void embedding_backward<E>(Ptr, Ptr, const E*, const int32_t*, int, int, int, int,    \
                                        int, const int32_t*, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
