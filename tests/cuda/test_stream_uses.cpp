// The caching allocator against work on a stream of its own (kernels/cuda/stream_uses.h), as
// NcclComm's non-blocking collectives run: a block released while that work still reads it is
// handed out again, and what the compute stream then writes into it must wait for the work.
// The "collective" here is a copy on a side stream held back by a host function that sleeps
// for 200 ms: without the wait, the compute stream's write lands first and the copy reads it.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/stream_uses.h"

namespace cuda = trident::kernels::cuda;

namespace {

void sleep_200ms(void*) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

}  // namespace

TEST_CASE("cuda: a released block still in use on another stream is reused after that use",
          "[ops]") {
    const cudaStream_t compute = cuda::compute_stream();
    const std::size_t bytes = std::size_t{1} << 20;
    cuda::DeviceAllocator allocator;
    void* source = allocator.allocate(bytes);
    void* target = allocator.allocate(bytes);
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(source, 0x11, bytes, compute));
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(target, 0x00, bytes, compute));
    cuda::synchronize();

    cudaStream_t side = nullptr;
    TRIDENT_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    // The side stream's "collective": 200 ms of nothing, then source -> target.
    TRIDENT_CUDA_CHECK(cudaLaunchHostFunc(side, sleep_200ms, nullptr));
    TRIDENT_CUDA_CHECK(cudaMemcpyAsync(target, source, bytes, cudaMemcpyDeviceToDevice, side));
    cuda::record_stream_use(side, {{source, bytes}});
    REQUIRE(cuda::pending_stream_uses() >= 1);

    // Released before the copy ran, and handed straight back by the cache.
    allocator.release(source);
    void* again = allocator.allocate(bytes);
    REQUIRE(again == source);
    TRIDENT_CUDA_CHECK(cudaMemsetAsync(again, 0x22, bytes, compute));

    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(side));
    cuda::synchronize();
    std::vector<unsigned char> copied(bytes), reused(bytes);
    TRIDENT_CUDA_CHECK(cudaMemcpy(copied.data(), target, bytes, cudaMemcpyDeviceToHost));
    TRIDENT_CUDA_CHECK(cudaMemcpy(reused.data(), again, bytes, cudaMemcpyDeviceToHost));
    // The copy read the block's first contents; the new user's write came after it.
    REQUIRE(copied == std::vector<unsigned char>(bytes, 0x11));
    REQUIRE(reused == std::vector<unsigned char>(bytes, 0x22));

    // Only a released block that a pending use overlaps waits, and the use is then forgotten.
    TRIDENT_CUDA_CHECK(cudaLaunchHostFunc(side, sleep_200ms, nullptr));
    cuda::record_stream_use(side, {{target, bytes}});
    allocator.release(again);                   // overlaps no use
    REQUIRE(cuda::pending_stream_uses() == 1);  // target's, still under way
    allocator.release(target);  // overlaps it: the compute stream waits, the use is forgotten
    REQUIRE(cuda::pending_stream_uses() == 0);
    TRIDENT_CUDA_CHECK(cudaStreamSynchronize(side));
    cuda::synchronize();
    TRIDENT_CUDA_CHECK(cudaStreamDestroy(side));
}
