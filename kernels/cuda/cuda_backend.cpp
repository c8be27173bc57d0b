// The GPU backend as a run starts it (cuda_ops.h, make_cuda_backend): the op set, with every
// attention shape the run computes decided before step 1.
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/error.h"

namespace trident::kernels {

AttentionShape rank_attention(const RunAttention& run) {
    const int split = run.tensor * (run.context > 1 && !run.ring ? run.context : 1);
    return {run.micro_batch,   run.seq_len, run.hidden / split,
            run.heads / split, run.type,    run.drop_prob};
}

namespace {

// The flash kernels, the only ones `what` runs on: the run's head size must be theirs.
void check_flash(const RunAttention& run, const std::string& what) {
    if (!cuda::flash_attention_supports(run.hidden / run.heads))
        throw Error(what + " take heads of 1 to " + std::to_string(cuda::kFlashMaxHeadSize) +
                    " elements, not " + std::to_string(run.hidden / run.heads));
}

}  // namespace

std::string prepare_run_attention(Ops& ops, const RunAttention& run) {
    if (run.context > 1 && run.ring) {
        // Each rank's blocks of queries against blocks of keys: the block kernels alone.
        check_flash(run, "ring attention's GPU kernels");
        return "attention: ring attention's block kernels over " + std::to_string(run.context) +
               " ranks\n";
    }
    if (run.documents) {
        // cuDNN's graphs here carry no document mask (attention_ops.h): the flash kernels.
        check_flash(run, "within documents (data.documents: mask) the GPU's flash kernels");
        return "attention: the flash kernels, within documents (cuDNN's fused attention here "
               "carries no document mask)\n";
    }
    return prepare_attention(ops, rank_attention(run));
}

CudaBackend make_cuda_backend(bool tf32, const RunAttention& run) {
    CudaBackend backend{make_cuda_ops(tf32), {}};
    backend.attention = prepare_run_attention(*backend.ops, run);
    return backend;
}

}  // namespace trident::kernels
