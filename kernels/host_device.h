// TRIDENT_HOST_DEVICE: marks an inline function that the host code and the CUDA kernels
// (kernels/cuda/) both compile, so that both backends compute it bit for bit alike.
#pragma once

#if defined(__CUDACC__)
#define TRIDENT_HOST_DEVICE __host__ __device__
#else
#define TRIDENT_HOST_DEVICE
#endif
