// Grid: the order rank = tp + M*(cp + C*(dp + D*pp)), and the groups made by splitting the
// world.
#include "parallel/grid.h"

#include <mpi.h>

#include <algorithm>
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

int GridShape::size(Axis a) const {
    switch (a) {
        case Axis::pipeline:
            return pipeline;
        case Axis::data:
            return data;
        case Axis::context:
            return context;
        case Axis::tensor:
            break;
    }
    return tensor;
}

int Coordinates::along(Axis a) const {
    switch (a) {
        case Axis::pipeline:
            return pp;
        case Axis::data:
            return dp;
        case Axis::context:
            return cp;
        case Axis::tensor:
            break;
    }
    return tp;
}

const char* group_name(Group g) {
    static constexpr const char* kNames[kGroups] = {
        "tensor",     "context",    "data",         "data-context", "pipeline",    "embedding",
        "kv-replica", "data-shard", "data-replica", "expert",       "expert-data", "expert-shard"};
    return kNames[static_cast<std::size_t>(g)];
}

namespace {

// The ranks that differ from `c` along `axis` alone, in its order.
std::vector<int> along(const GridShape& s, Coordinates c, Axis axis) {
    std::vector<int> ranks;
    for (int i = 0; i < s.size(axis); ++i) {
        Coordinates at = c;
        (axis == Axis::pipeline  ? at.pp
         : axis == Axis::data    ? at.dp
         : axis == Axis::context ? at.cp
                                 : at.tp) = i;
        ranks.push_back(rank_of(s, at));
    }
    return ranks;
}

// Of `ranks` (a group, in its order), the run of n consecutive ones holding position q, or
// (across) the ranks with q's place in every run.
std::vector<int> run_of(const std::vector<int>& ranks, int q, int n, bool across) {
    std::vector<int> out;
    const int count = static_cast<int>(ranks.size());
    for (int i = 0; i < (across ? count / n : n); ++i)
        out.push_back(ranks[static_cast<std::size_t>(across ? q % n + n * i : q / n * n + i)]);
    return out;
}

// The data-context group: cp fastest, then dp (rank cp + C·dp within it).
std::vector<int> data_context_of(const GridShape& s, const Coordinates& c) {
    std::vector<int> ranks;
    for (int dp = 0; dp < s.data; ++dp)
        for (int cp = 0; cp < s.context; ++cp) ranks.push_back(rank_of(s, {c.pp, dp, c.tp, cp}));
    return ranks;
}

std::vector<int> embedding_of(const GridShape& s, const Coordinates& c, int rank) {
    const bool first = c.pp == 0, last = c.pp == s.pipeline - 1 && !s.head_on_first_stage;
    if (s.pipeline == 1 || s.head_on_first_stage || !(first || last)) return {rank};
    return {rank_of(s, {0, c.dp, c.tp, c.cp}), rank_of(s, {s.pipeline - 1, c.dp, c.tp, c.cp})};
}

// The runs a group is cut into: kv-replica within the tensor group, data-shard and expert
// within the data-context group; the runs' length.
int run_length(const GridShape& s, Group g) {
    if (g == Group::kv_replica) return s.kv_replicas;
    if (g == Group::expert || g == Group::expert_data || g == Group::expert_shard) return s.expert;
    return s.data_shard == 0 ? s.data * s.context : s.data_shard;
}

}  // namespace

std::vector<int> group_ranks(const GridShape& s, Group g, int rank) {
    const Coordinates c = coordinates_of(s, rank);
    const int q = c.cp + s.context * c.dp;  // this rank's place in the data-context group
    switch (g) {
        case Group::tensor:
            return along(s, c, Axis::tensor);
        case Group::context:
            return along(s, c, Axis::context);
        case Group::data:
            return along(s, c, Axis::data);
        case Group::pipeline:
            return along(s, c, Axis::pipeline);
        case Group::embedding:
            return embedding_of(s, c, rank);
        case Group::kv_replica:
            return run_of(along(s, c, Axis::tensor), c.tp, run_length(s, g), false);
        case Group::data_context:
            break;
        case Group::data_shard:
        case Group::expert:
            return run_of(data_context_of(s, c), q, run_length(s, g), false);
        case Group::data_replica:
        case Group::expert_data:
            return run_of(data_context_of(s, c), q, run_length(s, g), true);
        case Group::expert_shard:  // within the data-shard run, the places q mod E
            return run_of(group_ranks(s, Group::data_shard, rank), q, run_length(s, g), true);
    }
    return data_context_of(s, c);
}

namespace {

// The communicator of this rank's group of `g`: every rank takes part, colour the group's
// first member (groups of one kind partition the world), key its place in the group. Named
// for the watchdog's messages.
std::unique_ptr<Comm> split(MpiComm& world, const GridShape& shape, Group g, int rank) {
    const std::vector<int> members = group_ranks(shape, g, rank);
    const int key =
        static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    MPI_Comm group;
    MPI_Comm_split(world.handle(), members.front(), key, &group);
    auto comm = std::make_unique<MpiComm>(group);
    comm->set_name(g == Group::data_context && shape.context == 1 ? "data" : group_name(g));
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
    // The runs the tensor and data-context groups are cut into.
    const int DC = s.context * s.data;
    const auto runs = [](int n, int of, const char* what) {
        if (n < 1 || of % n != 0)
            throw Error("internal: " + std::string(what) + " of " + std::to_string(n) + " over " +
                        std::to_string(of) + " ranks");
    };
    runs(s.kv_replicas, s.tensor, "key/value head replicas");
    runs(s.data_shard == 0 ? DC : s.data_shard, DC, "data shards");
    runs(s.expert, DC, "expert runs");
    runs(s.expert, s.data_shard == 0 ? DC : s.data_shard, "expert runs per data shard");
}

}  // namespace

Grid::Grid() {
    for (Group g :
         {Group::tensor, Group::context, Group::data, Group::data_context, Group::pipeline,
          Group::embedding, Group::kv_replica, Group::data_replica, Group::expert})
        groups_[static_cast<std::size_t>(g)] = std::make_unique<SoloComm>();
}

Grid::Grid(World& world, const GridShape& shape) : shape_(shape), rank_(world.rank()) {
    check_shape(shape, world.size());
    coords_ = coordinates_of(shape, rank_);
    MpiComm& all = world.mpi_comm();
    // Every rank takes part in every split, in Group's order.
    for (int i = 0; i < kGroups; ++i) {
        const Group g = static_cast<Group>(i);
        if (standing_for(g) != g) continue;  // another group is its communicator
        // Without hybrid sharding (or experts split) the replica (expert) group is this rank.
        const bool alone =
            (g == Group::data_replica && standing_for(Group::data_shard) != Group::data_shard) ||
            (g == Group::expert && shape.expert == 1);
        groups_[static_cast<std::size_t>(i)] =
            alone ? std::unique_ptr<Comm>(std::make_unique<SoloComm>())
                  : split(all, shape, g, rank_);
    }
}

Group Grid::standing_for(Group g) const {
    const int DC = shape_.data * shape_.context;
    const bool hybrid = shape_.data_shard != 0 && shape_.data_shard != DC;
    if (g == Group::data_shard && !hybrid) return Group::data_context;
    if (g == Group::expert_data && shape_.expert == 1) return Group::data_context;
    if (g == Group::expert_shard && !hybrid) return standing_for(Group::expert_data);
    if (g == Group::expert_shard && shape_.expert == 1) return standing_for(Group::data_shard);
    return g;
}

Comm& Grid::group(Group g) {
    return *groups_[static_cast<std::size_t>(standing_for(g))];
}

std::vector<Comm*> Grid::data_groups() {
    if (standing_for(Group::data_shard) != Group::data_shard) return {&data_context()};
    return {&data_context(), &data_shard(), &data_replica()};
}

Grid::~Grid() = default;

void Grid::wrap_comms(const CommWrapper& wrap) {
    for (std::unique_ptr<Comm>& group : groups_) {
        if (!group) continue;  // another group stands for it
        const GroupLabel* label = group->label();
        group = wrap(std::move(group));
        group->set_label(label);
    }
}

}  // namespace trident::parallel
