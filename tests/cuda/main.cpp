// The GPU tests' runner: without a GPU it says so and exits 77, which ctest reports as
// skipped (SKIP_RETURN_CODE); with one it names the GPU and the versions of the driver and
// libraries (scripts/gpu_verify.sh records them) and runs the Catch2 tests on GPU 0.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

#include "kernels/cuda/device.h"

int main(int argc, char** argv) {
    std::string why;
    if (trident::kernels::cuda::visible_gpu_count(&why) == 0) {
        std::printf("SKIPPED: the GPU tests need a GPU (%s)\n", why.c_str());
        return 77;
    }
    trident::kernels::cuda::use_gpu(0);
    std::printf("GPU: %s\n", trident::kernels::cuda::describe_gpu().c_str());
    std::printf("GPU libraries: %s\n", trident::kernels::cuda::describe_libraries().c_str());
    return Catch::Session().run(argc, argv);
}
