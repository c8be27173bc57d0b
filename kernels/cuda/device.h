// The GPU this process computes on: how many are visible, which one is used, its properties,
// and the one stream every kernel of the process is queued on.
//
// Trident runs one GPU per process (rank); all compute goes to one stream, so the order of
// ops is the order of calls and buffers can be reused as soon as an op is queued after the
// last one that touched them. Communication runs on streams of its own (NcclComm), ordered
// against this one with events.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace trident::kernels::cuda {

// GPUs the CUDA runtime can see; 0 when there is none or no usable driver (never throws).
// `why`, when given, receives the runtime's reason for a 0.
int visible_gpu_count(std::string* why = nullptr);

// Makes `device` this process's GPU (cudaSetDevice) and creates its compute stream. Call once,
// before any other function here or any kernel launch.
void use_gpu(int device);

// The chosen GPU's compute stream and properties (throw if use_gpu was not called).
cudaStream_t compute_stream();
const cudaDeviceProp& gpu_properties();

// "NVIDIA H100 80GB HBM3 (GPU 0, 132 SMs, 79.1 GiB)"
std::string describe_gpu();

// The versions of the CUDA driver and libraries this process runs with, for the log:
// "driver 580.95.05 (CUDA 13.0), runtime 13.0, cuBLASLt 13.1.0, cuDNN 9.19.0 (NVRTC 13.0:
// /usr/local/cuda/lib64/libnvrtc.so.13), NCCL 2.28.9". Needs no GPU chosen.
std::string describe_libraries();

// A GPU's identity across processes: its UUID as 32 hex digits.
std::string gpu_uuid(int device);

// Launch geometry: blocks of `threads` covering `work` items, at most a few waves of the
// machine (kernels loop over what is left).
unsigned blocks_for(std::size_t work, unsigned threads);

// Waits for everything queued on the compute stream.
void synchronize();

}  // namespace trident::kernels::cuda
