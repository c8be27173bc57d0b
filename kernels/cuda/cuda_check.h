// Error checks for the CUDA libraries: a failed call throws trident::Error naming the library,
// its message, the call, and the file and line, so a failure deep in a step is one clear line.
//
// Kernel launches are asynchronous: TRIDENT_CUDA_CHECK_LAUNCH() after a launch reports a bad
// launch configuration at once; a fault inside a kernel surfaces at the next call that waits
// for the device (a copy to the host, a synchronisation), naming that call.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace trident::kernels::cuda {

[[noreturn]] void throw_library_error(const char* library, const std::string& message,
                                      const char* call, const char* file, int line);

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
    if (status != cudaSuccess)
        throw_library_error("CUDA", cudaGetErrorString(status), call, file, line);
}

}  // namespace trident::kernels::cuda

#define TRIDENT_CUDA_CHECK(call) \
    ::trident::kernels::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define TRIDENT_CUDA_CHECK_LAUNCH() \
    ::trident::kernels::cuda::check_cuda(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
