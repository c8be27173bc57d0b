// Attention within documents (data.documents: mask, model/documents.h): the whole sequence on
// this rank, as LocalAttention, with key j visible to query i only from the start of i's
// document (Ops::document_attention_forward). The model builds it in place of the local core
// when the mask is on; the microbatch's documents come with its pass.
//
// Shapes (this rank): qkv (N, 3Hm), the output (N, Hm); the document starts (N) int32.
#pragma once

#include "model/attention_core.h"

namespace trident::model {

class DocumentAttention final : public AttentionCore {
public:
    DocumentAttention(const Dims& d, int head_begin, int heads_total,
                      const AttentionSavedFn& attention_saved, SetSpec& set);
    void forward(PartContext& ctx, const Pass& pass, kernels::Ptr qkv, kernels::Ptr out,
                 float drop) const override;
    void rebuild(PartContext& ctx, const Pass& pass, kernels::ConstPtr qkv,
                 float drop) const override;
    void backward(PartContext& ctx, const Pass& pass, kernels::Ptr dqkv, kernels::ConstPtr dout,
                  kernels::ConstPtr qkv, kernels::ConstPtr out, float drop) const override;

private:
    int head_begin_, heads_total_;
    int saved_;  // slot
};

// The core maker (MakeCore) of training under the document mask.
MakeCore document_core(const AttentionSavedFn& attention_saved);

}  // namespace trident::model
