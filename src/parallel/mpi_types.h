// The MPI datatype each element type (kernels::DType) travels as, the MPI operation that
// reduces it, and MPI's error codes as errors, for the MPI communicator (parallel/mpi_comm.h).
#pragma once

#include <mpi.h>

#include "kernels/dtype.h"
#include "parallel/comm.h"

namespace trident::parallel {

MPI_Datatype mpi_type(kernels::DType dtype);

// Throws for the element types that move but do not add (bool, fp8).
void check_reducible(kernels::DType dtype);

// The MPI operation that reduces `dtype` by `op`: MPI's own for the types MPI adds; for bf16
// and fp16 ours, which widen to fp32, combine and round back to nearest even.
MPI_Op reduce_op(kernels::DType dtype, ReduceOp op);

// Throws trident::Error with `call`'s name and MPI's text unless code is MPI_SUCCESS. MPI's
// own handler aborts by default; this matters where a caller has set MPI_ERRORS_RETURN.
void check_mpi(int code, const char* call);

}  // namespace trident::parallel
