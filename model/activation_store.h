// The activations of the (microbatch, chunk) pairs in flight: a set per pair, allocated from
// the chunk's declared buffers (model/buffer_spec.h) under the recompute policy, pooled per
// chunk (a set freed by its backward is the next forward's), and the one recompute scratch
// every set shares: one allocation as large as the largest layer's rebuilt buffers, each
// layer's laid out in it from its start (layers of different kinds, dense and MoE, alike).
//
// Recompute (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models", arXiv 2205.05198): selective keeps all but what attention keeps for its backward
// (Keep::unless_recompute), which the layer rebuilds from qkv before attention's backward;
// full keeps only each layer's output (Keep::always) and reruns the layer's forward,
// collectives included, just before its backward. Both rebuild into the shared scratch, and
// the kernels and dropout masks are deterministic, so the gradients are bitwise those without
// recompute. A split backward's sets also hold what its B keeps for its W (Keep::split); an
// attention's W that waits for the next MoE layer's exchange (parallel.ep_overlap) reads what
// its B kept from the shared scratch (Keep::deferrable): one layer's W waits at a time.
//
// A chunk's own buffers (its input, the embedding's and the head's) are kept in every set
// whatever the policy; only split ones follow split_backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/device_buffer.h"
#include "model/buffer_spec.h"
#include "model/documents.h"
#include "model/part_context.h"

namespace trident::model {

// What one local chunk's sets hold: its own buffers and its layers'.
struct ChunkSpec {
    SetSpec own;
    std::vector<const SetSpec*> layers;
};

// Where a chunk's own buffers go: in the set unless split-only and not split.
inline bool own_in_set(Keep keep, const KeepPolicy& policy) {
    return keep != Keep::split || policy.split_backward;
}

// What a split backward's B keeps for its W (zero-bubble schedules, pipeline/schedule.h): one
// buffer of the set a part declares (Keep::split, allocated only when the backward is split),
// which B fills and W reads. The store owns it; the part only says what goes in (a linear's
// output gradient, a norm's).
class WeightGradStash {
public:
    WeightGradStash() = default;  // none: the part keeps its own (the LM head's logits)
    WeightGradStash(SetSpec& set, std::string name, std::size_t count, kernels::DType dtype);
    // B: `value` (count elements) kept for W when this backward is a split one's B.
    void keep(PartContext& ctx, const Pass& pass, BackwardPart part, kernels::ConstPtr value) const;
    // W: what B kept.
    kernels::ConstPtr kept(const Pass& pass) const { return pass.buffers[slot_]; }

private:
    int slot_ = -1;
    std::size_t count_ = 0;
};

// Bytes of one set of `chunk` under `policy`, and of the recompute scratch of `layers`: the
// largest layer's buffers rebuilt into it, each from a 64-byte boundary.
std::size_t set_bytes(const ChunkSpec& chunk, const KeepPolicy& policy);
std::size_t recompute_scratch_bytes(const std::vector<const SetSpec*>& layers,
                                    const KeepPolicy& policy);

class ActivationStore {
public:
    struct Set {
        bool training = false;
        uint64_t seed = 0;    // the microbatch's dropout seed
        Documents documents;  // under data.documents: mask or mask_eod_loss, found by forward
        std::vector<kernels::DeviceBuffer> own;
        std::vector<std::vector<kernels::DeviceBuffer>> layers;
    };

    // `chunks`: per local chunk, its layers' specs among them.
    ActivationStore(kernels::Ops& ops, const KeepPolicy& policy, std::vector<ChunkSpec> chunks);

    const KeepPolicy& policy() const { return policy_; }

    Set& start(int mb, int c);
    Set& live(int mb, int c);
    void release(int mb, int c);

    // The buffers of a chunk's own slots, and of its layer i's (kept, or the scratch's).
    SetBuffers own(const Set& set) const;
    SetBuffers layer(const Set& set, int c, int i) const;

    // Sets allocated so far: the most pairs ever in flight; their bytes as allocated.
    std::size_t sets() const;
    std::size_t bytes() const { return bytes_; }

private:
    std::unique_ptr<Set> allocate(int c);

    kernels::Ops& ops_;
    KeepPolicy policy_;
    std::vector<ChunkSpec> chunks_;
    kernels::DeviceBuffer scratch_;  // the recompute scratch (bytes)
    // Where each slot of local chunk c's layer i lies in it ([c][i][slot]; null: in the set).
    std::vector<std::vector<std::vector<kernels::Ptr>>> scratch_slots_;
    std::map<std::pair<int, int>, std::unique_ptr<Set>> live_;
    std::vector<std::vector<std::unique_ptr<Set>>> pool_;
    std::size_t bytes_ = 0;
};

}  // namespace trident::model
