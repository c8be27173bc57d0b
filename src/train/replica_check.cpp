// Replicas compared by hash (see replica_check.h).
#include "train/replica_check.h"

#include <cstring>
#include <map>
#include <vector>

#include "io/fault_injection.h"
#include "kernels/error.h"
#include "parallel/agreement.h"
#include "parallel/watchdog.h"

namespace trident::train {

namespace {

uint64_t fnv1a(const float* values, std::size_t count) {
    uint64_t h = 0xcbf29ce484222325ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(values);
    for (std::size_t i = 0; i < count * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
    return h;
}

// Copies of tensors that the members of a group must hold alike: each one's name and hash.
struct Hashes {
    std::vector<std::string> names;
    std::vector<uint64_t> values;
    // The tensors of `layout` in `host` (its flat buffer) that `keep` selects, named with
    // `prefix`.
    template <typename Keep>
    void add(const model::ParamLayout& layout, const std::vector<float>& host,
             const std::string& prefix, Keep keep) {
        for (const model::ParamTensor& t : layout.tensors()) {
            if (!keep(t)) continue;
            names.push_back(prefix + t.name);
            values.push_back(fnv1a(host.data() + t.offset, t.numel));
        }
    }
};

// The first member of `group` whose copy of a tensor differs from what most members hold
// (ties: the first member's), as a message; "" if none. Collective over the group.
std::string compare(parallel::Comm& group, const char* what, const Hashes& mine,
                    const parallel::GridShape& shape, int step) {
    const std::size_t n = mine.values.size(), members = static_cast<std::size_t>(group.size());
    if (members == 1 || n == 0) return "";
    std::vector<uint64_t> all(n * members);
    group.all_gather(kernels::ConstPtr(mine.values.data(), kernels::DType::u8),
                     kernels::Ptr(all.data(), kernels::DType::u8), n * sizeof(uint64_t));
    const auto world_rank = [&](std::size_t member) {
        return parallel::describe_rank(shape, group.label()->world_ranks[member]);
    };
    for (std::size_t t = 0; t < n; ++t) {
        std::map<uint64_t, std::size_t> votes;
        for (std::size_t m = 0; m < members; ++m) ++votes[all[m * n + t]];
        if (votes.size() == 1) continue;
        std::size_t reference = 0;  // the first member holding what most hold
        for (std::size_t m = 1; m < members; ++m)
            if (votes[all[m * n + t]] > votes[all[reference * n + t]]) reference = m;
        const uint64_t expected = all[reference * n + t];
        for (std::size_t m = 0; m < members; ++m) {
            if (all[m * n + t] == expected) continue;
            const std::size_t alike = votes[expected];
            return "training.check_replicas: at step " + std::to_string(step) + " the " + what +
                   " disagree: rank " + world_rank(m) + " holds another " + mine.names[t] +
                   " than rank " + world_rank(reference) +
                   (alike > 1 ? " and " + std::to_string(alike - 1) + " other(s) of its " +
                                    std::to_string(members) + " do"
                              : "");
        }
    }
    return "";
}

// The test fault TRIDENT_TEST_CORRUPT_REPLICA (io/fault_injection.h): a bit of the first
// element of parameter `name` flipped, as a bit flip in memory would (bit 20, a mantissa bit
// that fp32, bf16 and fp16 all keep). The parameters must be whole (not ZeRO-3).
void flip_a_bit(kernels::Ops& ops, model::Gpt& gpt, const std::string& name) {
    const model::ParamTensor* t = gpt.layout().find(name);
    if (!t) throw Error("TRIDENT_TEST_CORRUPT_REPLICA: no parameter " + name);
    float value = 0;
    ops.copy_to_host(&value, gpt.weights().params().at(t->offset), 1);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    bits ^= 1u << 20;
    std::memcpy(&value, &bits, sizeof bits);
    ops.copy_from_host(gpt.weights().params().at(t->offset), &value, 1);
}

}  // namespace

std::string check_replicas(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                           parallel::Comm& world, int step) {
    model::Gpt& gpt = trainer.model();
    const int zero_stage = cfg.parallel.zero_stage;
    if (const std::string name = io::fault::corrupt_replica(step, grid.rank()); !name.empty())
        flip_a_bit(trainer.ops(), gpt, name);
    std::string found;
    {
        // The model's parameters, whole where they are sharded (ZeRO-3; collective).
        trainer.data_parallel().finish_param_gather();
        const std::vector<float> params = trainer.local_model_params();
        const auto replicated = [](const model::ParamTensor& t) {
            return t.split.kind == model::SplitKind::replicated;
        };
        const auto kv_replicated = [](const model::ParamTensor& t) { return t.replicas > 1; };
        Hashes data, experts, tensor, kv;
        // A buffer's tensors: a split expert's to the expert-data group's, the rest to the
        // data-context group's.
        const auto replicas = [&](const model::ParamLayout& layout, const std::vector<float>& host,
                                  const std::string& prefix) {
            data.add(layout, host, prefix,
                     [&](const model::ParamTensor& t) { return !layout.split_expert(t); });
            experts.add(layout, host, prefix,
                        [&](const model::ParamTensor& t) { return layout.split_expert(t); });
        };
        if (zero_stage < 3) replicas(gpt.layout(), params, "");
        tensor.add(gpt.layout(), params, "", replicated);
        kv.add(gpt.layout(), params, "", kv_replicated);
        if (gpt.frozen()) {
            const std::vector<float> adapters = trainer.local_params();
            replicas(gpt.trainable().layout(), adapters, "");
            tensor.add(gpt.trainable().layout(), adapters, "", replicated);
        }
        // The optimizer's state, where every replica holds it whole.
        if (zero_stage == 0) {
            const optim::OptimizerState s = trainer.optimizer_state();
            for (std::size_t k = 0; k < s.names.size(); ++k)
                replicas(gpt.trainable().layout(), s.values[k], s.names[k] + "/");
        }
        found = compare(grid.data_context(), "data-parallel replicas", data, grid.shape(), step);
        const std::string across_experts =
            compare(grid.group(parallel::Group::expert_data), "expert-data replicas", experts,
                    grid.shape(), step);
        if (found.empty()) found = across_experts;
        const std::string across_tensor =
            compare(grid.tensor(), "tensor-parallel ranks", tensor, grid.shape(), step);
        const std::string across_kv =
            compare(grid.kv_replicas(), "key/value head replicas", kv, grid.shape(), step);
        if (found.empty()) found = across_tensor;
        if (found.empty()) found = across_kv;
    }
    return parallel::first_failure(world, found);
}

}  // namespace trident::train
