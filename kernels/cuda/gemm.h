// Gemm: the GPU backend's matrix products, row-major, through cuBLASLt.
//
// Precision: fp32 inputs multiply on the tensor cores in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32:
// inputs rounded to a 10-bit mantissa, fp32 accumulation) when the Gemm is made with tf32,
// else in true fp32 (CUBLAS_COMPUTE_32F), so fp32 runs match the CPU backend to ~1e-6; bf16
// and fp16 inputs run on the tensor cores with fp32 accumulation either way, and the output
// may be their type or fp32. The epilogue adds a bias (and
// applies GELU, keeping the pre-activation) in the same kernel, before the one rounding.
//
// cuBLASLt wants a matrix-layout and operation descriptor per shape and a heuristic query to
// pick its kernel; both cost far more than the small products of a step, so they are built
// once per distinct (shape, types, epilogue, pointer alignment) and kept. The workspace (32
// MiB, what cuBLAS recommends for Hopper) comes from the caching allocator once.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/dtype.h"

namespace trident::kernels::cuda {

class DeviceAllocator;

// The cuBLAS element type of a product's fp32, bf16 or fp16 buffer (throws for another).
cudaDataType_t cuda_type(DType t);

enum class Epilogue : uint8_t {
    none,
    bias,       // D = A'B' + bias, bias (cols) added to every row
    gelu_bias,  // D = gelu(A'B' + bias); aux (rows, cols) = A'B' + bias, the pre-activation
    dgelu,      // D = A'B' * gelu'(aux), aux as gelu_bias wrote it
};

// D (rows, cols) = alpha * A' (rows, inner) @ B' (inner, cols) + beta * D, all row-major; A' is A,
// or A^T for A stored (inner, rows) when trans_a; B' likewise. A and B share a type; D is that type
// or fp32 (and aux, bias the type of D).
struct GemmCall {
    int rows = 0, cols = 0, inner = 0;
    ConstPtr a;
    bool trans_a = false;
    ConstPtr b;
    bool trans_b = false;
    Ptr d;
    float alpha = 1.0f;
    float beta = 0.0f;  // 1: D += A'B' (the backward's accumulation)
    Epilogue epilogue = Epilogue::none;
    ConstPtr bias;
    Ptr aux;
};

class Gemm {
public:
    // tf32: fp32 products in TF32 on the tensor cores (above).
    Gemm(DeviceAllocator& allocator, bool tf32);
    ~Gemm();
    Gemm(const Gemm&) = delete;
    Gemm& operator=(const Gemm&) = delete;

    // Whether cuBLASLt multiplies these types (A and B alike; D theirs or fp32).
    static bool supports(DType ab_type, DType d_type);

    void run(const GemmCall& call, cudaStream_t stream);

private:
    struct Plan;
    // Everything a plan depends on but the pointers' values.
    using Key = std::tuple<int, int, int, bool, bool, bool, int, int, int, int>;
    Plan& plan_for(const GemmCall& call);

    DeviceAllocator& allocator_;
    bool tf32_;
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace trident::kernels::cuda
