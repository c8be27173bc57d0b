// Generation's key/value cache: every layer's keys and values of the positions decoded so far,
// and the attention core that reads it (model/decoder.h runs both). A llama model's cache holds
// its kv_heads key/value heads, not one per query head: grouped-query attention's memory saving
// (kv_heads / heads of a cache of every head). Keys are stored after rotary, at their absolute
// position, so a new token's query attends to them as they are.
//
// Shapes (the whole model in one process, d = head size): per layer k and v (seq_len, KVH·d),
// row p the token at position p.
#pragma once

#include <vector>

#include "kernels/device_buffer.h"
#include "model/attention_core.h"
#include "model/param_layout.h"

namespace trident::model {

class KvCache {
public:
    KvCache(kernels::Ops& ops, const GptShape& shape);

    int capacity() const { return capacity_; }  // seq_len positions
    // Positions held: the next token is at this one.
    int length() const { return length_; }
    // After a pass of `count` tokens has written theirs; or from the start again (reset).
    void advance(int count);
    void reset() { length_ = 0; }
    kernels::Ptr keys(int layer) const { return keys_[static_cast<std::size_t>(layer)].data(); }
    kernels::Ptr values(int layer) const { return values_[static_cast<std::size_t>(layer)].data(); }
    // Elements of the whole cache (every layer's k and v).
    std::size_t count() const { return 2 * keys_.size() * per_layer_; }

private:
    int capacity_, length_ = 0;
    std::size_t per_layer_;  // elements of one layer's k (or v)
    std::vector<kernels::DeviceBuffer> keys_, values_;
};

// The attention core of a layer during generation: the pass's tokens (its T rows, at
// positions length() ..) write their keys and values into the layer's cache and attend to it
// (Ops::cached_attention_forward). Forward only.
class CachedAttention final : public AttentionCore {
public:
    CachedAttention(KvCache& cache, const Dims& d) : cache_(cache), d_(d) {}
    void forward(PartContext& ctx, const Pass& pass, kernels::Ptr qkv, kernels::Ptr out,
                 float drop) const override;
    void rebuild(PartContext& ctx, const Pass& pass, kernels::ConstPtr qkv,
                 float drop) const override;
    void backward(PartContext& ctx, const Pass& pass, kernels::Ptr dqkv, kernels::ConstPtr dout,
                  kernels::ConstPtr qkv, kernels::ConstPtr out, float drop) const override;

private:
    KvCache& cache_;
    Dims d_;
};

// The maker of CachedAttention cores over `cache` (PartOptions::make_core).
MakeCore cached_cores(KvCache& cache);

}  // namespace trident::model
