// One rank's sizes of a microbatch (see dims.h).
#include "model/dims.h"

#include <string>

#include "kernels/error.h"

namespace trident::model {

Dims make_dims(const GptShape& shape, const DimsInputs& in) {
    Dims d;
    d.B = in.micro_batch;
    d.C = in.C;
    d.context_mode = in.context_mode;
    d.M = in.M;
    d.tensor_rank = in.tensor_rank;
    d.seq_len = shape.max_seq;
    d.T = shape.max_seq / in.C;
    d.N = d.B * d.T;
    d.sequence_parallel = in.sequence_parallel && in.M > 1;
    if (d.sequence_parallel && d.N % in.M != 0)
        throw Error("sequence parallelism splits the micro batch's B*T = " + std::to_string(d.N) +
                    " rows over parallel.tensor = " + std::to_string(in.M) +
                    " ranks: they must divide");
    d.tp_overlap = d.sequence_parallel && in.tp_overlap;
    d.R = d.sequence_parallel ? d.N / in.M : d.N;
    d.H = shape.hidden;
    d.Hm = shape.attention_width() / in.M;
    d.Fm = shape.ffn / in.M;
    d.heads = shape.heads / in.M;
    // Fewer key/value heads than ranks: each rank holds one, replicated (model/param_layout.h).
    d.kv_heads = shape.kv_heads * kv_replicas(shape.kv_heads, in.M) / in.M;
    d.Vm = shape.padded_vocab / in.M;
    d.act = in.activations;
    d.expert_ranks = in.expert_ranks;
    return d;
}

}  // namespace trident::model
