// The P x M x C x D grid: which (pipeline, data, context, tensor) coordinates a rank has and
// the process groups it belongs to (Megatron's parallel_state).
//
// Order (docs/ARCHITECTURE.md, "Grid order"; Megatron's default tp-cp-dp-pp):
// rank = tp + M * (cp + C * (dp + D * pp)). Tensor-parallel ranks are neighbours (one node),
// context-parallel ranks next, pipeline is the slowest axis.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace trident::parallel {

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
};

struct Coordinates {
    int pp = 0, dp = 0, tp = 0, cp = 0;
};

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

    Comm& tensor() { return *tensor_; }    // same pp, dp, cp: the M tensor-parallel ranks
    Comm& context() { return *context_; }  // same pp, dp, tp: the C ranks of one sequence
    Comm& data() { return *data_; }        // same pp, tp, cp: the D data-parallel replicas
    // Same pp, tp: the D·C ranks that hold the same weights (rank cp + C·dp), over which
    // their gradients are summed and the optimizer shards (Megatron's data-context group).
    Comm& data_context() { return *data_context_; }
    // Hybrid sharding (docs/ARCHITECTURE.md, "Hybrid sharding"): the data-context group cut
    // into runs of N = data_shard consecutive ranks. ZeRO shards over the run (data-shard:
    // ranks q..q+N-1 of the data-context group, q a multiple of N) and its parts are
    // replicated across the runs (data-replica: the D·C/N ranks with the same q mod N). With
    // N = D·C they are the data-context group itself and this rank alone.
    Comm& data_shard() { return data_shard_ ? *data_shard_ : *data_context_; }
    Comm& data_replica() { return *data_replica_; }
    // The groups the data-parallel exchange and the loss use, each once: the data-context
    // group, and with hybrid sharding the shard and replica groups.
    std::vector<Comm*> data_groups();
    Comm& pipeline() { return *pipeline_; }  // same dp, tp, cp: the P stages, in order
    // The first and last stage with this (dp, tp, cp), which share the tied embedding: group
    // rank 0 is the first stage, 1 the last. With P == 1, or the head on the first stage, it
    // is this rank alone; on a stage without embedding or head (not in_embedding_group) it
    // is also this rank alone, so its calls do nothing.
    Comm& embedding() { return *embedding_; }
    bool in_embedding_group() const {
        return first_stage() || (last_stage() && !shape_.head_on_first_stage);
    }
    // The kv_replicas ranks of the tensor group that hold this rank's key/value head (tensor
    // ranks r·⌊tp/r⌋ ..), over which its gradients are summed; this rank alone when r = 1.
    Comm& kv_replicas() { return *kv_replicas_; }

    // Hands each group's communicator to `wrap` and keeps what it returns, in one order on
    // every rank (tensor, context, data, data-context, pipeline, embedding, kv-replica,
    // data-shard, data-replica): how a GPU
    // backend puts communicators for device buffers over the same ranks (parallel/cuda).
    // Collective over the world.
    using CommWrapper = std::function<std::unique_ptr<Comm>(std::unique_ptr<Comm>)>;
    void wrap_comms(const CommWrapper& wrap);

private:
    GridShape shape_;
    Coordinates coords_;
    int rank_ = 0;
    std::unique_ptr<Comm> tensor_, context_, data_, data_context_, pipeline_, embedding_,
        kv_replicas_, data_shard_, data_replica_;
};

}  // namespace trident::parallel
