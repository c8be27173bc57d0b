// The bias gradient of a linear layer: dbias (OC) += column sums of dout (N,OC), in a fixed
// order (column_partials.cuh). cuBLASLt could fold it into the weight-gradient GEMM (epilogue
// BGRADB), but that overwrites rather than adds and its order is the library's; this pass
// reads dout once more, a small cost next to the GEMMs.
//
// Pass 1 gives each thread a 16-byte pack of columns (P = kPack<E> of them) of one chunk of
// rows: a warp reads 512 adjacent bytes of a row per load, and a thread keeps P sums. Where
// the rows do not allow whole packs (OC not a multiple of P, an unaligned buffer) the same
// thread reads the same elements one by one: the sums, and so the bits, are the same.
#include <algorithm>

#include "kernels/cuda/column_partials.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

constexpr int kThreads = 128;

// Chunks of rows: a function of N alone (the order of the sums), 32 rows or more each, up to
// 512 of them so that a few columns' worth of threads still fill the GPU.
int chunks_of(int N) {
    return std::max(1, std::min(512, (N + 31) / 32));
}

// partial (chunks, OC): per chunk of rows, the column sums of dout; thread t of the grid's x
// sums columns t·P .. t·P + P - 1.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    bias_partials_kernel(float* partial, const E* dout, int N, int OC, int chunk_rows,
                         bool vector) {
    constexpr int P = kPack<E>;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * P;
    const int chunk = blockIdx.y;
    if (c >= OC) return;
    const int end = min(N, (chunk + 1) * chunk_rows);
    float sum[P] = {};
#pragma unroll 4
    for (int n = chunk * chunk_rows; n < end; ++n) {
        const E* row = dout + static_cast<std::size_t>(n) * OC + c;
        Pack<E> v;
        if (vector) {
            v = load_pack(row);
        } else {
#pragma unroll
            for (int e = 0; e < P; ++e) v.v[e] = c + e < OC ? row[e] : from_float<E>(0.0f);
        }
#pragma unroll
        for (int e = 0; e < P; ++e) sum[e] += to_float(v.v[e]);
    }
    float* out = partial + static_cast<std::size_t>(chunk) * OC + c;
#pragma unroll
    for (int e = 0; e < P; ++e)
        if (c + e < OC) out[e] = sum[e];
}

}  // namespace

std::size_t bias_grad_scratch(int N, int OC) {
    return static_cast<std::size_t>(chunks_of(N)) * OC;
}

template <typename E>
void bias_grad(Ptr dbias, float* scratch, const E* dout, int N, int OC, cudaStream_t stream) {
    if (N == 0 || OC == 0) return;
    require_float_elements(dbias.dtype, "a bias gradient");
    const int chunks = chunks_of(N), chunk_rows = (N + chunks - 1) / chunks;
    const int packs = (OC + kPack<E> - 1) / kPack<E>;
    const dim3 grid(static_cast<unsigned>((packs + kThreads - 1) / kThreads),
                    static_cast<unsigned>(chunks));
    const bool vector = OC % kPack<E> == 0 && pack_aligned(dout);
    bias_partials_kernel<<<grid, kThreads, 0, stream>>>(scratch, dout, N, OC, chunk_rows, vector);
    TRIDENT_CUDA_CHECK_LAUNCH();
    add_column_partials<1>({{dbias}}, scratch, chunks, OC, stream);
}

template void bias_grad<float>(Ptr, float*, const float*, int, int, cudaStream_t);
template void bias_grad<__nv_bfloat16>(Ptr, float*, const __nv_bfloat16*, int, int, cudaStream_t);
template void bias_grad<__half>(Ptr, float*, const __half*, int, int, cudaStream_t);

}  // namespace trident::kernels::cuda
