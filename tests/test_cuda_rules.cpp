// The GPU backend's rules that need no GPU to check (in a build with the CUDA backend): which
// cuDNN versions and attention shapes cuDNN's fused attention must not run
// (kernels/cuda/attention.h), so that those fall back to the flash kernels; and the attention a
// run's layout gives each rank (kernels/cuda/cuda_ops.h), ring attention's and the document
// mask's head sizes among it.
#if TRIDENT_HAVE_CUDA

#include <catch2/catch.hpp>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/error.h"

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

TEST_CASE("GPU start-up: the attention each rank of a layout computes", "[cuda-rules]") {
    using trident::kernels::rank_attention;
    using trident::kernels::RunAttention;
    // 16 heads of 64 (1024 channels), micro batch 4, T = 512.
    const auto shape = [](int tensor, int context, bool ring) {
        const RunAttention run{4, 512, 1024, 16, tensor, context, ring, DType::bf16, 0.1f, false};
        const trident::kernels::AttentionShape s = rank_attention(run);
        CHECK(s.B == 4);
        CHECK(s.T == 512);  // Ulysses: the whole sequence, a C-th of the heads
        CHECK(s.type == DType::bf16);
        CHECK(s.drop_prob == 0.1f);
        CHECK(s.channels / s.NH == 64);
        return s.NH;
    };
    CHECK(shape(1, 1, true) == 16);
    CHECK(shape(2, 1, true) == 8);   // tensor parallelism: its share
    CHECK(shape(2, 4, false) == 2);  // and Ulysses a context-th of that
    CHECK(shape(2, 4, true) == 8);   // ring attention keeps the rank's heads
}

TEST_CASE("GPU start-up: ring attention's block kernels refuse heads over 128", "[cuda-rules]") {
    // The ring's decision reads only the shape: any backend will do.
    const auto ops = trident::kernels::make_cpu_ops(1);
    const trident::kernels::RunAttention fits{2, 128, 512, 4, 1, 2, true, DType::f32, 0.0f, false};
    CHECK(prepare_run_attention(*ops, fits) ==
          "attention: ring attention's block kernels over 2 ranks\n");
    const trident::kernels::RunAttention wide{2, 128, 640, 4, 1, 2, true, DType::f32, 0.0f, false};
    try {
        prepare_run_attention(*ops, wide);
        FAIL("ring attention with heads of 160 was accepted");
    } catch (const trident::Error& e) {
        CHECK(std::string(e.what()).find("take heads of 1 to 128 elements, not 160") !=
              std::string::npos);
    }
}

TEST_CASE("GPU start-up: within documents the flash kernels, which refuse heads over 128",
          "[cuda-rules]") {
    // The choice within documents reads only the shape: any backend will do.
    const auto ops = trident::kernels::make_cpu_ops(1);
    for (const int context : {1, 2}) {  // alone, and under Ulysses
        INFO("context " << context);
        const trident::kernels::RunAttention fits{2,       128,   512,         4,    1,
                                                  context, false, DType::bf16, 0.0f, true};
        CHECK(prepare_run_attention(*ops, fits) ==
              "attention: the flash kernels, within documents (cuDNN's fused attention here "
              "carries no document mask)\n");
        const trident::kernels::RunAttention wide{2,       128,   640,         4,    1,
                                                  context, false, DType::bf16, 0.0f, true};
        try {
            prepare_run_attention(*ops, wide);
            FAIL("documents with heads of 160 were accepted");
        } catch (const trident::Error& e) {
            CHECK(std::string(e.what()) ==
                  "within documents (data.documents: mask) the GPU's flash kernels take heads "
                  "of 1 to 128 elements, not 160");
        }
    }
    // Ring attention within documents: its block kernels, as without.
    const trident::kernels::RunAttention ring{2, 128, 512, 4, 1, 2, true, DType::bf16, 0.0f, true};
    CHECK(prepare_run_attention(*ops, ring) ==
          "attention: ring attention's block kernels over 2 ranks\n");
}

#endif  // TRIDENT_HAVE_CUDA
