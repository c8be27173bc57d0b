// The GPU backend's entry point (the CPU's is make_cpu_ops in kernels/ops.h): CudaOps
// implements the Ops interface on device buffers of the GPU that cuda::use_gpu chose
// (kernels/cuda/device.h), with every op queued on that GPU's compute stream.
#pragma once

#include <memory>
#include <string>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace trident::kernels {

// Call after cuda::use_gpu. Creates the cuBLASLt and cuDNN handles and the GEMM workspace;
// cuDNN failing to start leaves attention to the built-in flash kernels (said once per shape).
// tf32: fp32 matrix products in TF32 on the tensor cores (training.tf32; cuda/gemm.h); false
// keeps them in true fp32, as the CPU backend computes them.
std::unique_ptr<Ops> make_cuda_ops(bool tf32);

// The attention a model computes: B sequences of T rows, NH heads of channels/NH elements each
// (this rank's share under tensor parallelism), activations of `type`, attention dropout drop_prob.
struct AttentionShape {
    int B, T, channels, NH;
    DType type;
    float drop_prob;
};

// Chooses, before the first step, the kernels of the model's attention on `ops` (a backend
// from make_cuda_ops): in training (with drop_prob) and in evaluation and generation
// (without), cuDNN's fused attention where it is safe for this cuDNN and shape and runs on
// it (tried once here), else the built-in flash kernels. Returns the choices, a line each,
// for the log. Throws trident::Error naming the cause when neither can run the shape (heads
// over 128 elements that cuDNN refuses): an error at start-up rather than in the first step.
std::string prepare_attention(Ops& ops, const AttentionShape& shape);

// The attention of a whole run: the model's micro batch, sequence, attention width (heads ·
// head size: the hidden size unless model.head_dim differs) and heads, its layout's tensor and
// context parallelism (`ring`: ring attention, else Ulysses), the activations' type, the
// attention dropout, and whether tokens attend within their documents (data.documents: mask).
struct RunAttention {
    int micro_batch, seq_len, hidden, heads;
    int tensor, context;
    bool ring;
    DType type;
    float drop_prob;
    bool documents;
};

// The attention each rank of the run computes with attention_forward: tensor parallelism's
// share of the heads, and under Ulysses a context-th of those over the whole sequence (ring
// attention runs its block kernels instead).
AttentionShape rank_attention(const RunAttention& run);

// Decides at start-up every attention shape the run computes (prepare_attention for
// rank_attention's shape; within documents the flash kernels, as ring attention's block
// kernels, checked against the head size, which needs no GPU) and returns the log's lines;
// throws trident::Error naming the cause when a shape has no kernel.
std::string prepare_run_attention(Ops& ops, const RunAttention& run);

// The backend of a training run: make_cuda_ops with the attention kernels of every shape
// `run` computes chosen (prepare_run_attention), so that a model no kernel can run stops at
// start-up. `attention` holds the choices, a line each, for the log.
struct CudaBackend {
    std::unique_ptr<Ops> ops;
    std::string attention;
};
CudaBackend make_cuda_backend(bool tf32, const RunAttention& run);

}  // namespace trident::kernels
