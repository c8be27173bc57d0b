// cuBLASLt matrix products with cached plans (see gemm.h).
//
// Row-major to cuBLASLt's column-major: a row-major (r, c) matrix is a column-major (c, r) one,
// so D = A'B' is computed as D^T = B'^T A'^T, cuBLASLt's "A" being our B and its "B" our A,
// with m = cols, n = rows, k = inner. A bias per column of our D is then a bias per row of
// cuBLASLt's, which is what its BIAS epilogue adds.
#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        throw_library_error("cuBLASLt", cublasLtGetStatusString(status), call, file, line);
}
#define TRIDENT_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

// The largest power of two (up to 256) dividing the address: cuBLASLt's kernels read with
// vectors as wide as the alignment its heuristic was promised.
int alignment_of(const void* p) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    int alignment = 256;
    while (alignment > 1 && address % alignment != 0) alignment /= 2;
    return alignment;
}

cublasLtEpilogue_t epilogue_of(Epilogue e) {
    switch (e) {
        case Epilogue::bias:
            return CUBLASLT_EPILOGUE_BIAS;
        case Epilogue::gelu_bias:
            return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        case Epilogue::dgelu:
            return CUBLASLT_EPILOGUE_DGELU;
        case Epilogue::none:
            break;
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

// Creates `operation`, the description of c's product in cuBLASLt's terms: its transposes
// (op_a, op_b), its epilogue and what that epilogue needs but its pointers.
void describe_operation(cublasLtMatmulDesc_t& operation, const GemmCall& c,
                        cublasComputeType_t compute, cudaDataType_t d_type, cublasOperation_t op_a,
                        cublasOperation_t op_b) {
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation, compute, CUDA_R_32F));
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                                        &op_a, sizeof(op_a)));
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_TRANSB,
                                                        &op_b, sizeof(op_b)));
    const cublasLtEpilogue_t epilogue = epilogue_of(c.epilogue);
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                        &epilogue, sizeof(epilogue)));
    if (c.epilogue == Epilogue::bias || c.epilogue == Epilogue::gelu_bias) {
        // The bias has D's type; the pointers are set per call.
        TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &d_type, sizeof(d_type)));
    }
    if (c.epilogue == Epilogue::gelu_bias || c.epilogue == Epilogue::dgelu) {
        // The pre-activation's type is left unset: it is then D's, and cuBLASLt documents
        // setting it only for fp8 products.
        const int64_t aux_ld = c.cols;
        TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    }
}

// cuBLASLt's first choice of kernel for the described product, within our workspace and for
// pointers aligned to `alignment` bytes; an error naming the product if it has none.
cublasLtMatmulAlgo_t choose_algorithm(cublasLtHandle_t handle, cublasLtMatmulDesc_t operation,
                                      cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                      cublasLtMatrixLayout_t d, const GemmCall& c, int alignment) {
    // The preference, given back however this returns.
    struct Preference {
        cublasLtMatmulPreference_t handle = nullptr;
        ~Preference() {
            if (handle) cublasLtMatmulPreferenceDestroy(handle);
        }
    } preference;
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
    const uint64_t workspace = kWorkspaceBytes;
    const uint32_t aligned = static_cast<uint32_t>(alignment);
    TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
        sizeof(workspace)));
    for (auto attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        TRIDENT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, attribute,
                                                                  &aligned, sizeof(aligned)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, operation, a, b, d, d, preference.handle, 1, &result, &found);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
        throw Error("cuBLASLt has no kernel for a " + std::to_string(c.rows) + "x" +
                    std::to_string(c.inner) + " by " + std::to_string(c.inner) + "x" +
                    std::to_string(c.cols) + " product (" + name_of(c.a.dtype) + " -> " +
                    name_of(c.d.dtype) + ", epilogue " +
                    std::to_string(static_cast<int>(c.epilogue)) + ", alignment " +
                    std::to_string(alignment) + " bytes): " + cublasLtGetStatusString(status));
    }
    return result.algo;
}

}  // namespace

struct Gemm::Plan {
    cublasLtMatmulDesc_t operation = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};

    ~Plan() {
        if (d) cublasLtMatrixLayoutDestroy(d);
        if (b) cublasLtMatrixLayoutDestroy(b);
        if (a) cublasLtMatrixLayoutDestroy(a);
        if (operation) cublasLtMatmulDescDestroy(operation);
    }
};

Gemm::Gemm(DeviceAllocator& allocator, bool tf32) : allocator_(allocator), tf32_(tf32) {
    TRIDENT_CUBLAS_CHECK(cublasLtCreate(&handle_));
    workspace_ = allocator_.allocate(kWorkspaceBytes);
}

Gemm::~Gemm() {
    plans_.clear();
    allocator_.release(workspace_);
    if (handle_) cublasLtDestroy(handle_);
}

bool Gemm::supports(DType ab_type, DType d_type) {
    switch (ab_type) {
        case DType::f32:
            return d_type == DType::f32;
        case DType::bf16:
        case DType::f16:
            return d_type == ab_type || d_type == DType::f32;
        default:
            return false;
    }
}

Gemm::Plan& Gemm::plan_for(const GemmCall& c) {
    const int alignment = std::min(
        {alignment_of(c.a.data), alignment_of(c.b.data), alignment_of(c.d.data),
         c.bias ? alignment_of(c.bias.data) : 256, c.aux ? alignment_of(c.aux.data) : 256});
    const cudaDataType_t ab_type = cuda_type(c.a.dtype), d_type = cuda_type(c.d.dtype);
    const Key key{c.rows,
                  c.cols,
                  c.inner,
                  c.trans_a,
                  c.trans_b,
                  c.beta != 0.0f,
                  static_cast<int>(ab_type),
                  static_cast<int>(d_type),
                  static_cast<int>(c.epilogue),
                  alignment};
    auto& slot = plans_[key];
    if (slot) return *slot;

    auto plan = std::make_unique<Plan>();
    // cuBLASLt's A is our B, its B our A (see the top of this file).
    const cublasOperation_t op_a = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const uint64_t m = static_cast<uint64_t>(c.cols), n = static_cast<uint64_t>(c.rows),
                   k = static_cast<uint64_t>(c.inner);
    // fp32 accumulation and scale factors always; TF32 inputs only for fp32 products.
    const cublasComputeType_t compute =
        tf32_ && ab_type == CUDA_R_32F ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    describe_operation(plan->operation, c, compute, d_type, op_a, op_b);
    // Stored shapes, column-major: (rows, cols, leading dimension).
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, ab_type, op_a == CUBLAS_OP_N ? m : k,
                                                    op_a == CUBLAS_OP_N ? k : m,
                                                    op_a == CUBLAS_OP_N ? m : k));
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, ab_type, op_b == CUBLAS_OP_N ? k : n,
                                                    op_b == CUBLAS_OP_N ? n : k,
                                                    op_b == CUBLAS_OP_N ? k : n));
    TRIDENT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, d_type, m, n, m));
    plan->algo =
        choose_algorithm(handle_, plan->operation, plan->a, plan->b, plan->d, c, alignment);
    slot = std::move(plan);
    return *slot;
}

void Gemm::run(const GemmCall& c, cudaStream_t stream) {
    if (c.rows == 0 || c.cols == 0) return;
    if (c.b.dtype != c.a.dtype || !supports(c.a.dtype, c.d.dtype) ||
        (c.bias && c.bias.dtype != c.d.dtype) || (c.aux && c.aux.dtype != c.d.dtype))
        throw Error("internal: no cuBLASLt product for these element types");
    Plan& plan = plan_for(c);
    if (c.epilogue == Epilogue::bias || c.epilogue == Epilogue::gelu_bias) {
        TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            plan.operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias.data, sizeof(c.bias.data)));
    }
    if (c.epilogue == Epilogue::gelu_bias || c.epilogue == Epilogue::dgelu) {
        TRIDENT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            plan.operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux.data,
            sizeof(c.aux.data)));
    }
    TRIDENT_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.operation, &c.alpha, c.b.data, plan.a,
                                        c.a.data, plan.b, &c.beta, c.d.data, plan.d, c.d.data,
                                        plan.d, &plan.algo, workspace_, kWorkspaceBytes, stream));
}

cudaDataType_t cuda_type(DType t) {
    switch (t) {
        case DType::f32:
            return CUDA_R_32F;
        case DType::bf16:
            return CUDA_R_16BF;
        case DType::f16:
            return CUDA_R_16F;
        default:
            throw Error(std::string("internal: a matrix product of ") + name_of(t) + " elements");
    }
}

}  // namespace trident::kernels::cuda
