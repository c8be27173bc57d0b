// Token + position embedding on one rank's slice of the vocabulary, forward and backward
// (shapes in kernels/ops.h: a token outside [vocab_begin, vocab_begin + vocab_local) looks up
// a zero row here, its row lives on another tensor-parallel rank; row t of a sequence is at
// position positions[t], or t without positions).
//
// Backward without atomics, in O(N log N + N·channels): the N positions are sorted by token (CUB's
// radix sort of keys row << 32 | position, so a token's positions stay in increasing order),
// then one block per token (the block of its first sorted position) sums that token's gradient
// rows in position order and adds the sum once. Every sum has one fixed order, so a run repeats
// bit for bit, whatever the scheduling.
#include <bit>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int local_row(int32_t token, int vocab_begin, int vocab_local) {
    const int row = token - vocab_begin;
    return row >= 0 && row < vocab_local ? row : -1;
}

// out (B*T, channels): one block per row.
__device__ __forceinline__ int position_of(const int32_t* positions, int t) {
    return positions ? positions[t] : t;
}

template <typename E>
__global__ void embedding_forward_kernel(E* out, const int32_t* tokens, const E* wte, const E* wpe,
                                         int T, int channels, int vocab_begin, int vocab_local,
                                         const int32_t* positions) {
    const int bt = blockIdx.x;
    const int row = local_row(tokens[bt], vocab_begin, vocab_local);
    const E* wte_row = row >= 0 ? wte + static_cast<std::size_t>(row) * channels : nullptr;
    const E* wpe_row =
        wpe != nullptr ? wpe + static_cast<std::size_t>(position_of(positions, bt % T)) * channels
                       : nullptr;
    E* out_row = out + static_cast<std::size_t>(bt) * channels;
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
        float x = wte_row ? to_float(wte_row[c]) : 0.0f;
        if (wpe_row) x += to_float(wpe_row[c]);
        out_row[c] = from_float<E>(x);
    }
}

// keys (N) = the position's local row (vocab_local for a token outside the slice) << 32 | its
// index.
__global__ void sort_keys_kernel(uint64_t* keys, const int32_t* tokens, int N, int vocab_begin,
                                 int vocab_local) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const int row = local_row(tokens[i], vocab_begin, vocab_local);
    keys[i] = static_cast<uint64_t>(row >= 0 ? row : vocab_local) << 32 | static_cast<uint32_t>(i);
}

// dwte (vocab_local, channels) += the dout rows of each token, summed in position order: block k
// works when sorted position k is its token's first, over the token's run of sorted positions.
template <typename E>
__global__ void embedding_backward_wte_kernel(Ptr dwte, const E* dout, const uint64_t* sorted,
                                              int N, int channels, int vocab_local) {
    const int k = blockIdx.x;
    const uint32_t row = static_cast<uint32_t>(sorted[k] >> 32);
    if (row >= static_cast<uint32_t>(vocab_local)) return;  // outside the slice: sorted last
    if (k > 0 && static_cast<uint32_t>(sorted[k - 1] >> 32) == row) return;
    __shared__ int end;
    if (threadIdx.x == 0) {
        int e = k + 1;
        while (e < N && static_cast<uint32_t>(sorted[e] >> 32) == row) ++e;
        end = e;
    }
    __syncthreads();
    const std::size_t row_begin = static_cast<std::size_t>(row) * channels;
    for (int c = threadIdx.x; c < channels; c += blockDim.x) {
        float sum = 0.0f;
        for (int j = k; j < end; ++j) {
            const std::size_t position = static_cast<uint32_t>(sorted[j]);
            sum += to_float(dout[position * channels + c]);
        }
        const std::size_t at = row_begin + c;
        store_from_float(dwte.data, dwte.dtype, at, load_as_float(dwte.data, dwte.dtype, at) + sum);
    }
}

// The sort's end bit: the key's position part and enough bits for rows up to vocab_local.
int sort_end_bit(int vocab_local) {
    return 32 + std::bit_width(static_cast<uint32_t>(vocab_local));
}

// The scratch of one backward, each part 256-byte aligned: the sort's own storage, then the
// keys (N) and the sorted keys (N).
struct ScratchLayout {
    std::size_t sort_bytes, keys_at, sorted_at, total;
};

ScratchLayout scratch_layout(int N, int vocab_local) {
    const auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
    std::size_t sort_bytes = 0;
    TRIDENT_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(
        nullptr, sort_bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
        N, 0, sort_end_bit(vocab_local)));
    const std::size_t keys = aligned(static_cast<std::size_t>(N) * sizeof(uint64_t));
    return {sort_bytes, aligned(sort_bytes), aligned(sort_bytes) + keys,
            aligned(sort_bytes) + 2 * keys};
}

// dwpe at the T rows' positions += dout summed over the batch, in batch order: one thread per
// element (the positions are distinct).
template <typename E>
__global__ void embedding_backward_wpe_kernel(Ptr dwpe, const E* dout, int B, int T, int channels,
                                              const int32_t* positions) {
    const std::size_t TC = static_cast<std::size_t>(T) * channels;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < TC;
         i += stride) {
        float sum = 0.0f;
        for (int b = 0; b < B; ++b) sum += to_float(dout[b * TC + i]);
        const int t = static_cast<int>(i / channels);
        const std::size_t at =
            static_cast<std::size_t>(position_of(positions, t)) * channels + i % channels;
        store_from_float(dwpe.data, dwpe.dtype, at, load_as_float(dwpe.data, dwpe.dtype, at) + sum);
    }
}

}  // namespace

template <typename E>
void embedding_forward(E* out, const int32_t* tokens, const E* wte, const E* wpe, int B, int T,
                       int channels, int vocab_begin, int vocab_local, const int32_t* positions,
                       cudaStream_t stream) {
    if (B * T == 0) return;
    embedding_forward_kernel<<<B * T, kThreads, 0, stream>>>(out, tokens, wte, wpe, T, channels,
                                                             vocab_begin, vocab_local, positions);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

std::size_t embedding_backward_scratch(int N, int vocab_local) {
    return scratch_layout(N, vocab_local).total;
}

template <typename E>
void embedding_backward(Ptr dwte, Ptr dwpe, void* scratch, const E* dout, const int32_t* tokens,
                        int B, int T, int channels, int vocab_begin, int vocab_local,
                        const int32_t* positions, cudaStream_t stream) {
    const int N = B * T;
    if (N == 0) return;
    require_float_elements(dwte.dtype, "a token embedding gradient");
    if (dwpe) require_float_elements(dwpe.dtype, "a position embedding gradient");
    ScratchLayout layout =
        scratch_layout(N, vocab_local);  // SortKeys takes sort_bytes by reference
    char* base = static_cast<char*>(scratch);
    auto* keys = reinterpret_cast<uint64_t*>(base + layout.keys_at);
    auto* sorted = reinterpret_cast<uint64_t*>(base + layout.sorted_at);
    sort_keys_kernel<<<(N + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
        keys, tokens, N, vocab_begin, vocab_local);
    TRIDENT_CUDA_CHECK_LAUNCH();
    TRIDENT_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(base, layout.sort_bytes, keys, sorted, N, 0,
                                                      sort_end_bit(vocab_local), stream));
    embedding_backward_wte_kernel<<<N, kThreads, 0, stream>>>(dwte, dout, sorted, N, channels,
                                                              vocab_local);
    TRIDENT_CUDA_CHECK_LAUNCH();
    if (dwpe.data != nullptr) {
        embedding_backward_wpe_kernel<<<
            blocks_for(static_cast<std::size_t>(T) * channels, kThreads), kThreads, 0, stream>>>(
            dwpe, dout, B, T, channels, positions);
        TRIDENT_CUDA_CHECK_LAUNCH();
    }
}

#define TRIDENT_INSTANTIATE(E)                                                                     \
    template void embedding_forward<E>(E*, const int32_t*, const E*, const E*, int, int, int, int, \
                                       int, const int32_t*, cudaStream_t);                         \
    template void embedding_backward<E>(Ptr, Ptr, void*, const E*, const int32_t*, int, int, int,  \
                                        int, int, const int32_t*, cudaStream_t);
TRIDENT_INSTANTIATE(float)
TRIDENT_INSTANTIATE(__nv_bfloat16)
TRIDENT_INSTANTIATE(__half)
#undef TRIDENT_INSTANTIATE

}  // namespace trident::kernels::cuda
