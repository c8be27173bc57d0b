// The process's GPU and compute stream (see device.h), and the library error messages.
#include "kernels/cuda/device.h"

#include <cublasLt.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <regex>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/error.h"
#include "kernels/host_wait.h"  // the host's wait for the device, marked as in cuda_ops.cpp
#include "kernels/source_path.h"

namespace trident::kernels::cuda {

namespace {

struct Gpu {
    int device = -1;
    cudaStream_t stream = nullptr;
    cudaDeviceProp properties{};
};

Gpu& gpu() {
    static Gpu g;
    return g;
}

const Gpu& chosen() {
    const Gpu& g = gpu();
    if (g.device < 0) throw Error("internal: a CUDA call before use_gpu() chose the GPU");
    return g;
}

}  // namespace

void throw_library_error(const char* library, const std::string& message, const char* call,
                         const char* file, int line) {
    std::string text = std::string(source_path(file)) + ":" + std::to_string(line) + ": " +
                       library + " error: " + message + " (in " + call + ")";
    if (message.find("out of memory") != std::string::npos)
        text += "; try a smaller training.micro_batch, activation recompute, or more ranks";
    throw Error(text);
}

int visible_gpu_count(std::string* why) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        if (why) *why = cudaGetErrorString(status);
        cudaGetLastError();  // clear it: the CPU backend goes on without the GPU
        return 0;
    }
    if (count == 0 && why) *why = "the CUDA runtime sees no GPU";
    return count;
}

void use_gpu(int device) {
    Gpu& g = gpu();
    if (g.device == device) return;
    if (g.device >= 0)
        throw Error("internal: this process already computes on GPU " + std::to_string(g.device));
    TRIDENT_CUDA_CHECK(cudaSetDevice(device));
    TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&g.properties, device));
    // Non-blocking: it never waits for the legacy default stream that libraries may use.
    TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
    g.device = device;
}

cudaStream_t compute_stream() {
    return chosen().stream;
}
const cudaDeviceProp& gpu_properties() {
    return chosen().properties;
}

std::string describe_gpu() {
    const Gpu& g = chosen();
    char memory[32];
    std::snprintf(memory, sizeof(memory), "%.1f GiB",
                  static_cast<double>(g.properties.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    return std::string(g.properties.name) + " (GPU " + std::to_string(g.device) + ", " +
           std::to_string(g.properties.multiProcessorCount) + " SMs, " + memory + ")";
}

namespace {

// CUDA's versions are major * 1000 + minor * 10.
std::string cuda_version_text(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// The kernel driver's release ("580.95.05"), which the CUDA API does not give; empty when
// /proc does not say.
std::string driver_release() {
    std::ifstream in("/proc/driver/nvidia/version");
    std::string line;
    std::getline(in, line);
    std::smatch found;
    static const std::regex release(R"(Module[^0-9]*([0-9]+\.[0-9]+(\.[0-9]+)?))");
    return std::regex_search(line, found, release) ? found[1].str() : "";
}

}  // namespace

// A version query's text: `text` of the version, or the library's reason it gave none (a
// missing driver, a library that did not load).
template <typename Text>
std::string version_or_why(bool ok, const char* why, Text text) {
    return ok ? text() : std::string("unknown (") + why + ")";
}

std::string describe_libraries() {
    int driver = 0, runtime = 0, nccl = 0;
    const cudaError_t driver_status = cudaDriverGetVersion(&driver);
    const cudaError_t runtime_status = cudaRuntimeGetVersion(&runtime);
    const ncclResult_t nccl_status = ncclGetVersion(&nccl);
    if (driver_status != cudaSuccess || runtime_status != cudaSuccess)
        cudaGetLastError();  // a query's failure is reported here, not at the next call
    const std::string release = driver_release();
    const std::size_t lt = cublasLtGetVersion();  // major * 10000 + minor * 100 + patch
    const std::string driver_text =
        version_or_why(driver_status == cudaSuccess, cudaGetErrorString(driver_status),
                       [&] { return "(CUDA " + cuda_version_text(driver) + ")"; });
    const std::string runtime_text =
        version_or_why(runtime_status == cudaSuccess, cudaGetErrorString(runtime_status),
                       [&] { return cuda_version_text(runtime); });
    const std::string nccl_text =
        version_or_why(nccl_status == ncclSuccess, ncclGetErrorString(nccl_status), [&] {
            return std::to_string(nccl / 10000) + "." + std::to_string(nccl % 10000 / 100) + "." +
                   std::to_string(nccl % 100);
        });
    return "driver " + (release.empty() ? "" : release + " ") + driver_text + ", runtime " +
           runtime_text + ", cuBLASLt " + std::to_string(lt / 10000) + "." +
           std::to_string(lt % 10000 / 100) + "." + std::to_string(lt % 100) + ", " +
           describe_cudnn() + ", NCCL " + nccl_text;
}

std::string gpu_uuid(int device) {
    cudaDeviceProp p{};
    TRIDENT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    std::string hex;
    char digits[3];
    for (char byte : p.uuid.bytes) {
        std::snprintf(digits, sizeof(digits), "%02x", static_cast<unsigned char>(byte));
        hex += digits;
    }
    return hex;
}

unsigned blocks_for(std::size_t work, unsigned threads) {
    const std::size_t needed = (work + threads - 1) / threads;
    // Enough blocks for every multiprocessor to hold several; grid-stride loops do the rest.
    const std::size_t most = static_cast<std::size_t>(gpu_properties().multiProcessorCount) * 16;
    return static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, most)));
}

void synchronize() {
    const HostWait wait;
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
}

}  // namespace trident::kernels::cuda
