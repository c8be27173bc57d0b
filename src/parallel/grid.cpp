// Grid: the order rank = tp + M*(cp + C*(dp + D*pp)), and the groups made by splitting the
// world.
#include "parallel/grid.h"

#include <mpi.h>

#include <string>
#include <utility>

#include "kernels/error.h"
#include "parallel/mpi_comm.h"
#include "parallel/solo_comm.h"
#include "parallel/world.h"

namespace trident::parallel {

int rank_of(const GridShape& g, const Coordinates& c) {
    return c.tp + g.tensor * (c.cp + g.context * (c.dp + g.data * c.pp));
}

Coordinates coordinates_of(const GridShape& g, int rank) {
    Coordinates c;
    c.tp = rank % g.tensor;
    c.cp = (rank / g.tensor) % g.context;
    c.dp = (rank / (g.tensor * g.context)) % g.data;
    c.pp = rank / (g.tensor * g.context * g.data);
    return c;
}

std::string describe_rank(const GridShape& g, int rank) {
    const Coordinates c = coordinates_of(g, rank);
    const std::string cp = g.context > 1 ? ", cp " + std::to_string(c.cp) : "";
    return std::to_string(rank) + " (pp " + std::to_string(c.pp) + ", tp " + std::to_string(c.tp) +
           cp + ", dp " + std::to_string(c.dp) + ")";
}

namespace {

// The group of ranks with the same `colour`, ordered (and numbered) by `key`, named `name` in
// the watchdog's messages.
std::unique_ptr<Comm> split(MpiComm& world, int colour, int key, const char* name) {
    MPI_Comm group;
    MPI_Comm_split(world.handle(), colour, key, &group);
    auto comm = std::make_unique<MpiComm>(group);
    comm->set_name(name);
    return comm;
}

void check_shape(const GridShape& s, int world_size) {
    const std::string product = std::to_string(s.pipeline) + " × " + std::to_string(s.tensor) +
                                " × " + std::to_string(s.context) + " × " + std::to_string(s.data);
    if (s.pipeline < 1 || s.tensor < 1 || s.context < 1 || s.data < 1)
        throw Error("parallel: pipeline × tensor × context × data = " + product +
                    ", but each must be at least 1");
    const long long processes = 1LL * s.pipeline * s.tensor * s.context * s.data;
    if (processes != world_size)
        throw Error("parallel: pipeline × tensor × context × data = " + product + " = " +
                    std::to_string(processes) + ", but " + std::to_string(world_size) +
                    (world_size == 1 ? " process was" : " processes were") +
                    " started (mpirun -np " + std::to_string(processes) + ")");
}

}  // namespace

Grid::Grid()
    : tensor_(std::make_unique<SoloComm>()),
      context_(std::make_unique<SoloComm>()),
      data_(std::make_unique<SoloComm>()),
      data_context_(std::make_unique<SoloComm>()),
      pipeline_(std::make_unique<SoloComm>()),
      embedding_(std::make_unique<SoloComm>()),
      kv_replicas_(std::make_unique<SoloComm>()),
      data_replica_(std::make_unique<SoloComm>()) {}

Grid::Grid(World& world, const GridShape& shape) : shape_(shape), rank_(world.rank()) {
    check_shape(shape, world.size());
    coords_ = coordinates_of(shape, rank_);
    const int M = shape.tensor, C = shape.context, D = shape.data;
    const auto [pp, dp, tp, cp] = coords_;
    MpiComm& all = world.mpi_comm();
    // Colour by the other coordinates, key by the group's own, so that the rank within a
    // group is the coordinate along it. Every rank takes part in every split.
    tensor_ = split(all, cp + C * (dp + D * pp), tp, "tensor");
    context_ = split(all, tp + M * (dp + D * pp), cp, "context");
    data_ = split(all, tp + M * (cp + C * pp), dp, "data");
    data_context_ = split(all, tp + M * pp, cp + C * dp, C > 1 ? "data-context" : "data");
    pipeline_ = split(all, tp + M * (cp + C * dp), pp, "pipeline");
    // Middle stages get a colour of their own each (beyond every (dp, cp, tp) colour): a
    // group of one.
    const int embedding_colour = in_embedding_group() ? tp + M * (cp + C * dp) : M * C * D + rank_;
    embedding_ = split(all, embedding_colour, pp, "embedding");
    // Within the tensor group, the runs of r consecutive ranks that share a key/value head.
    const int r = shape.kv_replicas;
    if (r < 1 || M % r != 0)
        throw Error("internal: " + std::to_string(r) + " key/value head replicas over " +
                    std::to_string(M) + " tensor ranks");
    kv_replicas_ = split(all, tp / r + M / r * (cp + C * (dp + D * pp)), tp % r, "kv-replica");
    // Within the data-context group (rank q), runs of N consecutive ranks and their replicas.
    const int N = shape.data_shard == 0 ? C * D : shape.data_shard;
    if (N < 1 || (C * D) % N != 0)
        throw Error("internal: data shards of " + std::to_string(N) + " over " +
                    std::to_string(C * D) + " data-context ranks");
    if (N == C * D) {  // no hybrid sharding: data_shard() is the data-context group
        data_replica_ = std::make_unique<SoloComm>();
        return;
    }
    const int q = cp + C * dp, groups = C * D / N;
    data_shard_ = split(all, q / N + groups * (tp + M * pp), q % N, "data-shard");
    data_replica_ = split(all, q % N + N * (tp + M * pp), q / N, "data-replica");
}

std::vector<Comm*> Grid::data_groups() {
    if (!data_shard_) return {data_context_.get()};
    return {data_context_.get(), data_shard_.get(), data_replica_.get()};
}

Grid::~Grid() = default;

void Grid::wrap_comms(const CommWrapper& wrap) {
    for (std::unique_ptr<Comm>* group :
         {&tensor_, &context_, &data_, &data_context_, &pipeline_, &embedding_, &kv_replicas_,
          &data_shard_, &data_replica_}) {
        if (!*group) continue;  // no hybrid sharding: no shard group of its own
        const GroupLabel* label = (*group)->label();
        *group = wrap(std::move(*group));
        (*group)->set_label(label);
    }
}

}  // namespace trident::parallel
