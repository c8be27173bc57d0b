// The MPI datatype each element type (kernels::DType) travels as, for the MPI communicator
// (parallel/mpi_comm.h).
#pragma once

#include <mpi.h>

#include "kernels/dtype.h"

namespace trident::parallel {

MPI_Datatype mpi_type(kernels::DType dtype);

}  // namespace trident::parallel
