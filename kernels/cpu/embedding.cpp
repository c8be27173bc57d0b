// Token + position embedding, forward and backward, on one rank's slice of the vocabulary.
//
// Under tensor parallelism wte is split by rows: this rank holds rows
// [vocab_begin, vocab_begin + vocab_local). A token outside the slice contributes nothing
// here (its row lives on another rank, and the callers sum the ranks' outputs), and wpe may
// be null so that only one rank adds the positions. Row t of a sequence is at position
// positions[t] (a context-parallel rank's tokens), or t without positions.
#include <cstddef>

#include "kernels/cpu/cpu_kernels.h"

namespace trident::kernels::cpu {

namespace {

// The token's row in this slice of wte, or -1 when another rank holds it.
inline int local_row(int32_t token, int vocab_begin, int vocab_local) {
    const int row = token - vocab_begin;
    return row >= 0 && row < vocab_local ? row : -1;
}

}  // namespace

// out (B,T,channels) = wte[tokens[b,t] - vocab_begin] (0 outside the slice) + wpe[position of t]
// (if any)
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                       int T, int channels, int vocab_begin, int vocab_local,
                       const int32_t* positions) {
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        const int row = local_row(tokens[bt], vocab_begin, vocab_local);
        float* out_row = out + static_cast<std::size_t>(bt) * channels;
        if (row >= 0) {
            const float* wte_row = wte + static_cast<std::size_t>(row) * channels;
            for (int c = 0; c < channels; c++) out_row[c] = wte_row[c];
        } else {
            for (int c = 0; c < channels; c++) out_row[c] = 0.0f;
        }
        if (wpe != nullptr) {
            const int t = bt % T;
            const float* wpe_row =
                wpe + static_cast<std::size_t>(positions ? positions[t] : t) * channels;
            for (int c = 0; c < channels; c++) out_row[c] += wpe_row[c];
        }
    }
}

// dwte (vocab_local,channels) += dout scattered by in-slice token; dwpe at the rows' positions +=
// dout summed over the batch, unless null. Repeated tokens make the scatter a reduction, so threads
// split the channels, not the positions: every gradient element is summed by one thread in (b,t)
// order, deterministic, independent of the thread count, and the same whatever the vocabulary
// split.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                        int T, int channels, int vocab_begin, int vocab_local,
                        const int32_t* positions) {
    constexpr int kBlock = 64;  // channels per task: whole cache lines, room to vectorise
    const int blocks = (channels + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int block = 0; block < blocks; block++) {
        const int c0 = block * kBlock;
        const int c1 = c0 + kBlock < channels ? c0 + kBlock : channels;
        for (int bt = 0; bt < B * T; bt++) {
            const float* dout_row = dout + static_cast<std::size_t>(bt) * channels;
            const int row = local_row(tokens[bt], vocab_begin, vocab_local);
            if (row >= 0) {
                float* dwte_row = dwte + static_cast<std::size_t>(row) * channels;
                for (int c = c0; c < c1; c++) dwte_row[c] += dout_row[c];
            }
            if (dwpe != nullptr) {
                const int t = bt % T;
                float* dwpe_row =
                    dwpe + static_cast<std::size_t>(positions ? positions[t] : t) * channels;
                for (int c = c0; c < c1; c++) dwpe_row[c] += dout_row[c];
            }
        }
    }
}

}  // namespace trident::kernels::cpu
