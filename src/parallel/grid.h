// The P x M x C x D grid: which (pipeline, data, context, tensor) coordinates a rank has and
// the process groups it belongs to (Megatron's parallel_state, torchtitan's ParallelDims).
//
// Order (docs/ARCHITECTURE.md, "Grid order"; Megatron's default tp-cp-dp-pp):
// rank = tp + M * (cp + C * (dp + D * pp)). Tensor-parallel ranks are neighbours (one node),
// context-parallel ranks next, pipeline is the slowest axis.
//
// The axes are named (Axis), and so are the groups (Group): each group's members are a pure
// function of the shape and a rank (group_ranks), and the Grid builds one communicator per
// named group from that function. A feature asks for a group by name and never computes ranks
// itself: the expert axis (E ranks of the data-context group sharing the experts of a layer,
// expert parallelism), its expert-data group (the D·C/E ranks holding the same experts) and,
// under hybrid sharding, its expert-shard group (those of them within one data-shard run) are
// derived so, beside hybrid sharding's data-shard and data-replica groups.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace trident::parallel {

// The grid's axes, slowest first.
enum class Axis { pipeline, data, context, tensor };

struct GridShape {
    int pipeline = 1;  // P
    int tensor = 1;    // M
    int data = 1;      // D
    int context = 1;   // C: the sequence split over C ranks
    // The consecutive tensor ranks that hold the same key/value head: M / KVH when M > KVH
    // (model/param_layout.h), else 1.
    int kv_replicas = 1;
    // The LM head on the first stage, beside the embedding (ZB-V's V-shaped placement,
    // model/param_layout.h), rather than on the last.
    bool head_on_first_stage = false;
    // Hybrid sharding: the consecutive ranks of the data-context group that ZeRO shards over
    // (parallel.data_shard); 0: all D·C of them.
    int data_shard = 0;
    // E: the consecutive ranks of the data-context group that split the experts of a layer
    // (expert parallelism); E divides D·C, and with hybrid sharding data_shard.
    int expert = 1;

    int size(Axis a) const;  // P, D, C or M
};

struct Coordinates {
    int pp = 0, dp = 0, tp = 0, cp = 0;
    int along(Axis a) const;
};

// The grid's groups, by name (docs/ARCHITECTURE.md, "Grid order").
enum class Group {
    tensor,        // same pp, dp, cp: the M tensor-parallel ranks
    context,       // same pp, dp, tp: the C ranks of one sequence
    data,          // same pp, tp, cp: the D data-parallel replicas
    data_context,  // same pp, tp: the D·C ranks holding the same weights, rank cp + C·dp
    pipeline,      // same dp, tp, cp: the P stages, in order
    embedding,     // the first and last stage of one (dp, cp, tp), sharing the tied embedding
    kv_replica,    // the tensor ranks sharing a key/value head
    data_shard,    // hybrid sharding: a run of data_shard ranks of the data-context group
    data_replica,  // ... and the ranks with the same place in every run
    expert,        // a run of E ranks of the data-context group: one layer's experts split
    expert_data,   // ... and the D·C/E ranks with the same place in every run
    expert_shard,  // hybrid sharding: the N/E ranks of a data-shard run with that place
};
inline constexpr int kGroups = 12;
// The name the watchdog's messages give the group ("data-context", "expert-shard").
const char* group_name(Group g);
// The world ranks of the group of `g` that `rank` belongs to, in group-rank order: pure
// arithmetic of the grid order, usable without MPI.
std::vector<int> group_ranks(const GridShape& shape, Group g, int rank);

// Pure arithmetic of the grid order, usable without MPI.
int rank_of(const GridShape& g, const Coordinates& c);
Coordinates coordinates_of(const GridShape& g, int rank);
// A rank as messages name it: "3 (pp 1, tp 0, dp 1)", with ", cp K" under context parallelism.
std::string describe_rank(const GridShape& g, int rank);

class World;

class Grid {
public:
    // The grid of one process (1 x 1 x 1 x 1): every group is this process alone. What a run
    // of one process, a single-process tool or a unit test hands the parts that take groups.
    Grid();
    // Splits the world into its groups (collective over the world). Throws trident::Error,
    // on every rank alike, when P*M*C*D != world size. A Grid must be gone before its World.
    Grid(World& world, const GridShape& shape);
    ~Grid();

    const GridShape& shape() const { return shape_; }
    const Coordinates& coordinates() const { return coords_; }
    int rank() const { return rank_; }
    bool first_stage() const { return coords_.pp == 0; }
    bool last_stage() const { return coords_.pp == shape_.pipeline - 1; }

    // The group of that name holding this rank (Group). Without hybrid sharding the
    // data-shard group is the data-context group and the data-replica group this rank alone;
    // with E = 1 the expert group is this rank alone and the expert-data group the
    // data-context group; without hybrid sharding the expert-shard group is the expert-data
    // group, and with E = 1 the data-shard group.
    Comm& group(Group g);

    Comm& tensor() { return group(Group::tensor); }
    Comm& context() { return group(Group::context); }
    Comm& data() { return group(Group::data); }
    // Same pp, tp: the D·C ranks that hold the same weights (rank cp + C·dp), over which
    // their gradients are summed and the optimizer shards (Megatron's data-context group).
    Comm& data_context() { return group(Group::data_context); }
    // Hybrid sharding (docs/ARCHITECTURE.md, "Hybrid sharding"): the data-context group cut
    // into runs of N = data_shard consecutive ranks. ZeRO shards over the run (data-shard:
    // ranks q..q+N-1 of the data-context group, q a multiple of N) and its parts are
    // replicated across the runs (data-replica: the D·C/N ranks with the same q mod N). With
    // N = D·C they are the data-context group itself and this rank alone.
    Comm& data_shard() { return group(Group::data_shard); }
    Comm& data_replica() { return group(Group::data_replica); }
    // The experts' shard group (docs/ARCHITECTURE.md, "Mixture of experts"): of the ranks
    // holding this rank's experts (expert-data), those within its data-shard run: same pp, tp,
    // ⌊q/N⌋ and q mod E, N/E of them, ranked ⌊(q mod N)/E⌋. A replica partner (same q mod N)
    // has the same q mod E and rank in it (E divides N), so it owns the same part of the same
    // experts.
    Comm& expert_shard() { return group(Group::expert_shard); }
    // The groups the data-parallel exchange and the loss use, each once: the data-context
    // group, and with hybrid sharding the shard and replica groups.
    std::vector<Comm*> data_groups();
    Comm& pipeline() { return group(Group::pipeline); }
    // The first and last stage with this (dp, tp, cp), which share the tied embedding: group
    // rank 0 is the first stage, 1 the last. With P == 1, or the head on the first stage, it
    // is this rank alone; on a stage without embedding or head (not in_embedding_group) it
    // is also this rank alone, so its calls do nothing.
    Comm& embedding() { return group(Group::embedding); }
    bool in_embedding_group() const {
        return first_stage() || (last_stage() && !shape_.head_on_first_stage);
    }
    // The kv_replicas ranks of the tensor group that hold this rank's key/value head (tensor
    // ranks r·⌊tp/r⌋ ..), over which its gradients are summed; this rank alone when r = 1.
    Comm& kv_replicas() { return group(Group::kv_replica); }

    // Hands each group's communicator to `wrap` and keeps what it returns, in one order on
    // every rank (Group's): how a GPU
    // backend puts communicators for device buffers over the same ranks (parallel/cuda).
    // Collective over the world.
    using CommWrapper = std::function<std::unique_ptr<Comm>(std::unique_ptr<Comm>)>;
    void wrap_comms(const CommWrapper& wrap);

private:
    // The group a named one stands for where it has no communicator of its own.
    Group standing_for(Group g) const;

    GridShape shape_;
    Coordinates coords_;
    int rank_ = 0;
    std::array<std::unique_ptr<Comm>, kGroups> groups_;  // by Group; empty: another stands for it
};

}  // namespace trident::parallel
