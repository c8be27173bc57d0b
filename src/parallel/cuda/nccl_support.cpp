// NCCL's error check, types and group guard (see nccl_support.h).
#include "parallel/cuda/nccl_support.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/error.h"

namespace trident::parallel {

using kernels::DType;

void check_nccl(ncclResult_t status, const char* call, const char* file, int line) {
    if (status != ncclSuccess)
        kernels::cuda::throw_library_error("NCCL", ncclGetErrorString(status), call, file, line);
}

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::f32:
            return ncclFloat32;
        case DType::bf16:
            return ncclBfloat16;
        case DType::f16:
        case DType::i16:
        case DType::u16:
            return ncclFloat16;
        case DType::f64:
            return ncclFloat64;
        case DType::i64:
            return ncclInt64;
        case DType::i32:
            return ncclInt32;
        case DType::u64:
            return ncclUint64;
        case DType::u32:
            return ncclUint32;
        case DType::i8:
            return ncclInt8;
        case DType::u8:
        case DType::boolean:
        case DType::f8_e4m3:
        case DType::f8_e5m2:
            return ncclUint8;
    }
    return ncclUint8;
}

ncclDataType_t nccl_reduction_type(DType t) {
    if (t == DType::i16 || t == DType::u16 || t == DType::boolean || t == DType::f8_e4m3 ||
        t == DType::f8_e5m2)
        throw Error(std::string("internal: an NCCL reduction over ") + kernels::name_of(t) +
                    " elements");
    return nccl_type(t);
}

NcclGroup::NcclGroup() {
    TRIDENT_NCCL_CHECK(ncclGroupStart());
}

NcclGroup::~NcclGroup() {
    if (open_) ncclGroupEnd();  // unwinding: its own failure is not the one to report
}

void NcclGroup::end() {
    open_ = false;
    TRIDENT_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace trident::parallel
