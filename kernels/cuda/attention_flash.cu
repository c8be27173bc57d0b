// Causal self-attention that never writes the T x T score matrix ("flash attention"): the
// GPU backend's own kernels, used where cuDNN's fused attention has no engine (fp32, head
// sizes it refuses, attention dropout, whose mask must be Trident's, attention within
// documents) and as the reference the cuDNN path is tested against.
//
// fp32 runs attention_kernels.cuh's kernels (fp32 arithmetic throughout, CUDA cores), on the
// geometry of flash_geometry.cuh; bf16 and fp16 run the tensor-core kernels of
// attention_mma.cu on the same geometry. Which kernels run depends on qkv's type alone, so a
// rebuild of the statistics (attention_ops.h) runs the forward's. Results are written in qkv's
// type.
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/flash_geometry.cuh"

namespace trident::kernels::cuda {

namespace {

dim3 blocks(const FlashGeometry& g, int rows) {
    return dim3(static_cast<unsigned>((g.T + rows - 1) / rows), static_cast<unsigned>(g.NH),
                static_cast<unsigned>(g.B));
}

}  // namespace

bool flash_attention_supports(int head_size) {
    return head_size >= 1 && head_size <= kFlashMaxHeadSize;
}

template <typename E>
void flash_attention_forward(E* out, float* lse, const E* qkv, int B, int T, int channels, int NH,
                             float drop_prob, uint64_t seed, int head_begin, int heads_total,
                             cudaStream_t stream, const int32_t* starts) {
    if (B * T == 0) return;
    const FlashGeometry g =
        flash_geometry<E>(B, T, channels, NH, drop_prob, seed, head_begin, heads_total, starts);
    if constexpr (std::is_same_v<E, float>) {
        with_split(g.hs, [&](auto split) {
            constexpr int Split = decltype(split)::value;
            attention_forward_kernel<Split>
                <<<blocks(g, kQueryRows), kQueryRows * Split, 0, stream>>>(out, lse, qkv, qkv, g,
                                                                           out != nullptr);
        });
        TRIDENT_CUDA_CHECK_LAUNCH();
    } else {
        tensor_core_attention_forward(out, lse, qkv, g, stream);
    }
}

template <typename E>
void flash_attention_backward(E* dqkv, float* row_dot, const E* dout, const E* qkv, const E* out,
                              const float* lse, int B, int T, int channels, int NH, float drop_prob,
                              uint64_t seed, int head_begin, int heads_total, cudaStream_t stream,
                              const int32_t* starts) {
    if (B * T == 0) return;
    const FlashGeometry g =
        flash_geometry<E>(B, T, channels, NH, drop_prob, seed, head_begin, heads_total, starts);
    const std::size_t rows = static_cast<std::size_t>(B) * NH * T;
    attention_row_dot_kernel<<<static_cast<unsigned>((rows + 7) / 8), 256, 0, stream>>>(
        row_dot, dout, out, g);
    TRIDENT_CUDA_CHECK_LAUNCH();
    if constexpr (std::is_same_v<E, float>) {
        with_split(g.hs, [&](auto split) {
            constexpr int Split = decltype(split)::value;
            attention_dkv_kernel<Split><<<blocks(g, kKeyRows), kKeyRows * Split, 0, stream>>>(
                dqkv, row_dot, dout, qkv, qkv, lse, g);
            attention_dq_kernel<Split><<<blocks(g, kQueryRows), kQueryRows * Split, 0, stream>>>(
                dqkv, row_dot, dout, qkv, qkv, lse, g);
        });
        TRIDENT_CUDA_CHECK_LAUNCH();
    } else {
        tensor_core_attention_backward(dqkv, row_dot, dout, qkv, lse, g, stream);
    }
}

#define TRIDENT_INSTANTIATE(E)                                                                   \
    template void flash_attention_forward<E>(E*, float*, const E*, int, int, int, int, float,    \
                                             uint64_t, int, int, cudaStream_t, const int32_t*);  \
    template void flash_attention_backward<E>(E*, float*, const E*, const E*, const E*,          \
                                              const float*, int, int, int, int, float, uint64_t, \
                                              int, int, cudaStream_t, const int32_t*);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
