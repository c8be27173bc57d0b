// The GPU backend's rules that need no GPU to check (in a build with the CUDA backend): which
// cuDNN versions and attention shapes cuDNN's fused attention must not run
// (kernels/cuda/attention.h), so that those fall back to the flash kernels.
#if TRIDENT_HAVE_CUDA

#include <catch2/catch.hpp>
#include <string>

#include "kernels/cuda/attention.h"

using trident::kernels::DType;
using trident::kernels::cuda::cudnn_attention_refusal;

namespace {

bool refused(int version, int sm_major, DType type, int T, int head_size,
             const std::string& because) {
    const std::string why = cudnn_attention_refusal(version, sm_major, type, T, head_size);
    INFO("cuDNN " << version << ", sm " << sm_major << ", T " << T << ", head size " << head_size
                  << ": \"" << why << "\"");
    return !why.empty() && why.find(because) != std::string::npos;
}

bool accepted(int version, int sm_major, DType type, int T, int head_size) {
    return cudnn_attention_refusal(version, sm_major, type, T, head_size).empty();
}

}  // namespace

TEST_CASE("cuDNN attention: the versions with known faults are refused", "[cuda-rules]") {
    for (int version : {91000, 91001})
        CHECK(refused(version, 9, DType::bf16, 1024, 64, "computes fused attention wrongly"));
    CHECK(accepted(91002, 9, DType::bf16, 1024, 64));
    CHECK(accepted(90100, 8, DType::f16, 128, 128));
}

TEST_CASE("cuDNN attention: before 9.16, sequences not a multiple of 128 are refused",
          "[cuda-rules]") {
    for (int version : {90000, 91002, 91500, 91501})
        CHECK(refused(version, 9, DType::bf16, 200, 64, "not a multiple of 128"));
    CHECK(accepted(91500, 9, DType::bf16, 256, 64));
    for (int version : {91600, 91900}) CHECK(accepted(version, 9, DType::bf16, 200, 64));
}

TEST_CASE("cuDNN attention: its types and head sizes", "[cuda-rules]") {
    CHECK(refused(91900, 9, DType::f32, 128, 64, "bf16 or fp16"));
    CHECK(refused(91900, 9, DType::bf16, 128, 60, "multiples of 8"));
    // Heads up to 256 on Hopper (compute capability 9), 128 elsewhere.
    CHECK(accepted(91900, 9, DType::f16, 128, 256));
    CHECK(refused(91900, 9, DType::f16, 128, 264, "up to 256"));
    CHECK(refused(91900, 8, DType::f16, 128, 160, "up to 128"));
    CHECK(accepted(91900, 8, DType::f16, 128, 128));
    CHECK(refused(91900, 9, DType::bf16, 1, 64, "single row"));
}

#endif  // TRIDENT_HAVE_CUDA
