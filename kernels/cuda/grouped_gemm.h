// GroupedGemm: the GPU backend's grouped products (Ops::grouped_matmul_forward and _backward,
// kernels/ops.h), a mixture of experts' GEMMs of one kind in one cuBLAS call
// (cublasGemmGroupedBatchedEx, cuBLAS 12.5 and later), each group its own shape and pointers.
//
// Precision as gemm.h's: fp32 in TF32 when made with tf32, else true fp32; bf16 and fp16 with
// fp32 accumulation. cuBLAS takes the groups' shapes on the host and their matrices' addresses
// on the device: those go up through the backend's staging (upload_staging.h) into a block of
// the caching allocator, ordered on the stream before the product that reads them.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/dtype.h"

namespace trident::kernels::cuda {

class DeviceAllocator;
class UploadStaging;

class GroupedGemm {
public:
    GroupedGemm(DeviceAllocator& allocator, UploadStaging& uploads, cudaStream_t stream, bool tf32);
    ~GroupedGemm();
    GroupedGemm(const GroupedGemm&) = delete;
    GroupedGemm& operator=(const GroupedGemm&) = delete;

    // The three products of Ops::grouped_matmul_forward and _backward (arguments as there),
    // each queued as one call when every buffer it touches is of one type (fp32, bf16 or
    // fp16); otherwise nothing is queued and they return false (the caller goes group by
    // group). Empty groups are left out.
    // out (N,OC) = each group's inp @ weights[g]^T.
    bool forward(Ptr out, ConstPtr inp, const ConstPtr* weights, const int32_t* offsets, int G,
                 int channels, int OC);
    // dinp (N,channels) += each group's dout @ weights[g].
    bool backward_input(Ptr dinp, ConstPtr dout, const ConstPtr* weights, const int32_t* offsets,
                        int G, int channels, int OC);
    // dweights[g] (OC,channels) += each group's dout^T @ inp.
    bool backward_weight(const Ptr* dweights, ConstPtr dout, ConstPtr inp, const int32_t* offsets,
                         int G, int channels, int OC);

private:
    // One group's product, row-major: d (rows, cols) = a' (rows, inner) @ b' (inner, cols) +
    // beta * d; a' is a, or a^T for a stored (inner, rows) when trans_a; b' likewise (gemm.h's
    // GemmCall).
    struct Product {
        int rows = 0, cols = 0, inner = 0;
        const void* a = nullptr;
        const void* b = nullptr;
        void* d = nullptr;
    };
    // Into `out`, the products of the groups with rows: make(first row, rows, g) gives each,
    // or none when its buffers are not of one type the grouped product takes (then false).
    template <typename Make>
    static bool collect(const int32_t* offsets, int G, Make make, std::vector<Product>& out);
    // Every product with the same transposes, type and beta (0: overwrite, 1: accumulate).
    void run(const std::vector<Product>& products, bool trans_a, bool trans_b, DType dtype,
             float beta);

    DeviceAllocator& allocator_;
    UploadStaging& uploads_;
    cudaStream_t stream_;
    bool tf32_;
    cublasHandle_t handle_ = nullptr;
};

}  // namespace trident::kernels::cuda
