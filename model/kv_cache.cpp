// Generation's key/value cache and its attention core (see kv_cache.h).
#include "model/kv_cache.h"

#include <string>

#include "kernels/error.h"

namespace trident::model {

KvCache::KvCache(kernels::Ops& ops, const GptShape& shape)
    : capacity_(shape.max_seq),
      per_layer_(static_cast<std::size_t>(shape.max_seq) * shape.kv_heads *
                 static_cast<std::size_t>(shape.head_size())) {
    for (int l = 0; l < shape.layers; ++l) {
        keys_.emplace_back(ops, per_layer_);
        values_.emplace_back(ops, per_layer_);
    }
}

void KvCache::advance(int count) {
    if (length_ + count > capacity_)
        throw Error("internal: " + std::to_string(length_ + count) +
                    " positions in a key/value cache of " + std::to_string(capacity_));
    length_ += count;
}

void CachedAttention::forward(PartContext& ctx, const Pass& pass, kernels::Ptr qkv,
                              kernels::Ptr out, float drop) const {
    (void)drop;  // generation has no dropout
    // qkv (T, 3Hm) of this pass's tokens, at positions length() .. length() + T - 1.
    ctx.ops.cached_attention_forward(out, cache_.keys(pass.layer), cache_.values(pass.layer), qkv,
                                     d_.T, cache_.length(), d_.heads, d_.kv_heads,
                                     d_.Hm / d_.heads);
}

void CachedAttention::rebuild(PartContext&, const Pass&, kernels::ConstPtr, float) const {
    throw Error("internal: generation's attention has no backward");
}

void CachedAttention::backward(PartContext&, const Pass&, kernels::Ptr, kernels::ConstPtr,
                               kernels::ConstPtr, kernels::ConstPtr, float) const {
    throw Error("internal: generation's attention has no backward");
}

MakeCore cached_cores(KvCache& cache) {
    return [&cache](const Dims& d, int, int, SetSpec&) {
        return std::make_unique<CachedAttention>(cache, d);
    };
}

}  // namespace trident::model
