// The MPI datatype and reduction of each element type, and MPI's errors (see mpi_types.h).
#include "parallel/mpi_types.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/error.h"

namespace trident::parallel {

namespace {

// One of our MPI operations on 16-bit floats: widen, combine in fp32, round back.
template <kernels::DType T, bool Max>
void combine16(void* in, void* inout, int* len, MPI_Datatype*) {
    const auto* a = static_cast<const uint16_t*>(in);
    auto* b = static_cast<uint16_t*>(inout);
    const auto widen = [](uint16_t h) {
        return T == kernels::DType::bf16 ? kernels::from_bf16(h) : kernels::from_f16(h);
    };
    const auto narrow = [](float x) {
        return T == kernels::DType::bf16 ? kernels::to_bf16(x) : kernels::to_f16(x);
    };
    for (int i = 0; i < *len; ++i) {
        const float x = widen(a[i]), y = widen(b[i]);
        b[i] = narrow(Max ? std::max(x, y) : x + y);
    }
}

}  // namespace

void check_reducible(kernels::DType dtype) {
    using kernels::DType;
    if (dtype == DType::boolean || dtype == DType::f8_e4m3 || dtype == DType::f8_e5m2)
        throw Error(std::string("internal: a reduction over ") + kernels::name_of(dtype) +
                    " elements");
}

// Ours are created once MPI runs (and kept until it ends).
MPI_Op reduce_op(kernels::DType dtype, ReduceOp op) {
    using kernels::DType;
    if (dtype != DType::bf16 && dtype != DType::f16) return op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    static const struct Ops16 {
        MPI_Op bf16_sum, bf16_max, f16_sum, f16_max;
        Ops16() {
            check_mpi(MPI_Op_create(&combine16<kernels::DType::bf16, false>, 1, &bf16_sum),
                      "MPI_Op_create");
            check_mpi(MPI_Op_create(&combine16<kernels::DType::bf16, true>, 1, &bf16_max),
                      "MPI_Op_create");
            check_mpi(MPI_Op_create(&combine16<kernels::DType::f16, false>, 1, &f16_sum),
                      "MPI_Op_create");
            check_mpi(MPI_Op_create(&combine16<kernels::DType::f16, true>, 1, &f16_max),
                      "MPI_Op_create");
        }
    } ops;
    if (dtype == kernels::DType::bf16) return op == ReduceOp::max ? ops.bf16_max : ops.bf16_sum;
    return op == ReduceOp::max ? ops.f16_max : ops.f16_sum;
}

void check_mpi(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw Error(std::string("parallel: ") + call + " failed: " + std::string(text, length));
}

// 16-bit floats travel as 16-bit words (their sums are ours, above); bool and fp8 as bytes.
MPI_Datatype mpi_type(kernels::DType dtype) {
    using kernels::DType;
    switch (dtype) {
        case DType::f32:
            return MPI_FLOAT;
        case DType::f64:
            return MPI_DOUBLE;
        case DType::bf16:
        case DType::f16:
        case DType::u16:
            return MPI_UINT16_T;
        case DType::i64:
            return MPI_INT64_T;
        case DType::i32:
            return MPI_INT32_T;
        case DType::i16:
            return MPI_INT16_T;
        case DType::i8:
            return MPI_INT8_T;
        case DType::u64:
            return MPI_UINT64_T;
        case DType::u32:
            return MPI_UINT32_T;
        case DType::u8:
        case DType::boolean:
        case DType::f8_e4m3:
        case DType::f8_e5m2:
            return MPI_UINT8_T;
    }
    return MPI_BYTE;
}

}  // namespace trident::parallel
