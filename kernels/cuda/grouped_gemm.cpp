// Grouped matrix products through cublasGemmGroupedBatchedEx (see grouped_gemm.h).
//
// Row-major to cuBLAS's column-major as in gemm.cpp: D = A'B' is computed as D^T = B'^T A'^T,
// cuBLAS's "A" being our b and its "B" our a, with m = cols, n = rows, k = inner. Each of our
// groups is one of cuBLAS's groups of one problem, since the experts' row counts differ.
#include "kernels/cuda/grouped_gemm.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/upload_staging.h"
#include "kernels/error.h"

namespace trident::kernels::cuda {

namespace {

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS)
        throw_library_error("cuBLAS", cublasGetStatusString(status), call, file, line);
}
#define TRIDENT_CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)

// Whether `d` and every type of `others` are one type the grouped product takes.
bool one_type(DType d, std::initializer_list<DType> others) {
    if (d != DType::f32 && d != DType::bf16 && d != DType::f16) return false;
    return std::all_of(others.begin(), others.end(), [d](DType t) { return t == d; });
}

}  // namespace

GroupedGemm::GroupedGemm(DeviceAllocator& allocator, UploadStaging& uploads, cudaStream_t stream,
                         bool tf32)
    : allocator_(allocator), uploads_(uploads), stream_(stream), tf32_(tf32) {
    TRIDENT_CUBLAS_CHECK(cublasCreate(&handle_));
    TRIDENT_CUBLAS_CHECK(cublasSetStream(handle_, stream_));
}

GroupedGemm::~GroupedGemm() {
    if (handle_) cublasDestroy(handle_);
}

template <typename Make>
bool GroupedGemm::collect(const int32_t* offsets, int G, Make make, std::vector<Product>& out) {
    for (int g = 0; g < G; ++g) {
        const int rows = offsets[g + 1] - offsets[g];
        if (rows == 0) continue;
        const std::optional<Product> p = make(static_cast<std::size_t>(offsets[g]), rows, g);
        if (!p) return false;
        out.push_back(*p);
    }
    return true;
}

bool GroupedGemm::forward(Ptr out, ConstPtr inp, const ConstPtr* weights, const int32_t* offsets,
                          int G, int channels, int OC) {
    std::vector<Product> products;
    const auto make = [&](std::size_t first, int rows, int g) -> std::optional<Product> {
        if (!one_type(out.dtype, {inp.dtype, weights[g].dtype})) return std::nullopt;
        return Product{rows,
                       OC,
                       channels,
                       (inp + first * channels).data,
                       weights[g].data,
                       (out + first * OC).data};
    };
    if (!collect(offsets, G, make, products)) return false;
    run(products, false, true, out.dtype, 0.0f);
    return true;
}

bool GroupedGemm::backward_input(Ptr dinp, ConstPtr dout, const ConstPtr* weights,
                                 const int32_t* offsets, int G, int channels, int OC) {
    std::vector<Product> products;
    const auto make = [&](std::size_t first, int rows, int g) -> std::optional<Product> {
        if (!one_type(dinp.dtype, {dout.dtype, weights[g].dtype})) return std::nullopt;
        return Product{rows,
                       channels,
                       OC,
                       (dout + first * OC).data,
                       weights[g].data,
                       (dinp + first * channels).data};
    };
    if (!collect(offsets, G, make, products)) return false;
    run(products, false, false, dinp.dtype, 1.0f);
    return true;
}

bool GroupedGemm::backward_weight(const Ptr* dweights, ConstPtr dout, ConstPtr inp,
                                  const int32_t* offsets, int G, int channels, int OC) {
    std::vector<Product> products;
    const auto make = [&](std::size_t first, int rows, int g) -> std::optional<Product> {
        if (!one_type(dout.dtype, {inp.dtype, dweights[g].dtype})) return std::nullopt;
        return Product{OC,
                       channels,
                       rows,
                       (dout + first * OC).data,
                       (inp + first * channels).data,
                       dweights[g].data};
    };
    if (!collect(offsets, G, make, products)) return false;
    run(products, true, false, dout.dtype, 1.0f);
    return true;
}

void GroupedGemm::run(const std::vector<Product>& products, bool trans_a, bool trans_b, DType dtype,
                      float beta) {
    const int G = static_cast<int>(products.size());
    if (G == 0) return;
    const std::size_t groups = products.size();
    // Per group, on the host: the shapes, leading dimensions and scalars.
    const std::vector<cublasOperation_t> op_b(groups, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N),
        op_a(groups, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    std::vector<int> m(groups), n(groups), k(groups), ld_b(groups), ld_a(groups), ld_d(groups);
    const std::vector<float> alphas(groups, 1.0f), betas(groups, beta);
    const std::vector<int> one(groups, 1);
    // On the device: cuBLAS's Aarray (our b), Barray (our a) and Carray (our d), group by group.
    std::vector<const void*> pointers(3 * groups);
    for (std::size_t g = 0; g < groups; ++g) {
        const Product& p = products[g];
        m[g] = p.cols;
        n[g] = p.rows;
        k[g] = p.inner;
        ld_b[g] = trans_b ? p.inner : p.cols;
        ld_a[g] = trans_a ? p.rows : p.inner;
        ld_d[g] = p.cols;
        pointers[g] = p.b;
        pointers[groups + g] = p.a;
        pointers[2 * groups + g] = p.d;
    }
    const Scratch device(allocator_, pointers.size() * sizeof(void*));
    uploads_.upload(device.data(), pointers.data(), pointers.size() * sizeof(void*));
    const auto* on_device = static_cast<const void* const*>(device.data());
    const cudaDataType_t type = cuda_type(dtype);
    const cublasComputeType_t compute =
        tf32_ && dtype == DType::f32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    TRIDENT_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
        handle_, op_b.data(), op_a.data(), m.data(), n.data(), k.data(), alphas.data(), on_device,
        type, ld_b.data(), on_device + groups, type, ld_a.data(), betas.data(),
        const_cast<void* const*>(on_device + 2 * groups), type, ld_d.data(), G, one.data(),
        compute));
}

}  // namespace trident::kernels::cuda
