// The bias gradient of a linear layer: dbias (OC) += column sums of dout (N,OC), in a fixed
// order (column_partials.cuh). cuBLASLt could fold it into the weight-gradient GEMM (epilogue
// BGRADB), but that overwrites rather than adds and its order is the library's; this pass
// reads dout once more, a small cost next to the GEMMs.
#include "kernels/cuda/column_partials.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elements.cuh"

namespace trident::kernels::cuda {

namespace {

// partial (chunks, OC): per chunk of rows, the column sums of dout.
template <typename E>
__global__ void bias_partials_kernel(float* partial, const E* dout, int N, int OC, int chunk_rows) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int chunk = blockIdx.y;
    if (c >= OC) return;
    const int end = min(N, (chunk + 1) * chunk_rows);
    float sum = 0.0f;
    for (int n = chunk * chunk_rows; n < end; ++n)
        sum += to_float(dout[static_cast<std::size_t>(n) * OC + c]);
    partial[static_cast<std::size_t>(chunk) * OC + c] = sum;
}

}  // namespace

std::size_t bias_grad_scratch(int N, int OC) {
    return static_cast<std::size_t>(row_chunks(N)) * OC;
}

template <typename E>
void bias_grad(Ptr dbias, float* scratch, const E* dout, int N, int OC, cudaStream_t stream) {
    if (N == 0) return;
    require_float_elements(dbias.dtype, "a bias gradient");
    const unsigned column_blocks =
        static_cast<unsigned>((OC + kColumnThreads - 1) / kColumnThreads);
    const dim3 grid(column_blocks, static_cast<unsigned>(row_chunks(N)));
    bias_partials_kernel<<<grid, kColumnThreads, 0, stream>>>(scratch, dout, N, OC,
                                                              rows_per_chunk(N));
    TRIDENT_CUDA_CHECK_LAUNCH();
    add_column_partials_kernel<1>
        <<<column_blocks, kColumnThreads, 0, stream>>>({{dbias}}, scratch, row_chunks(N), OC);
    TRIDENT_CUDA_CHECK_LAUNCH();
}

template void bias_grad<float>(Ptr, float*, const float*, int, int, cudaStream_t);
template void bias_grad<__nv_bfloat16>(Ptr, float*, const __nv_bfloat16*, int, int, cudaStream_t);
template void bias_grad<__half>(Ptr, float*, const __half*, int, int, cudaStream_t);

}  // namespace trident::kernels::cuda
