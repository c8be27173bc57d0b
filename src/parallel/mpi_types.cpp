// The MPI datatype of each element type (see mpi_types.h).
#include "parallel/mpi_types.h"

namespace trident::parallel {

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
