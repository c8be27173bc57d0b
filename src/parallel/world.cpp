// World: MPI's start and end, and the failure reports of world.h.
#include "parallel/world.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "kernels/error.h"
#include "parallel/mpi_comm.h"

namespace trident::parallel {

World::World(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized)
        throw Error("parallel: MPI is already initialised; construct one World a process");
    // MULTIPLE: the main thread and the communicators' workers (non-blocking collectives,
    // mpi_comm.h) call MPI at once; OpenMP threads only compute. An MPI that offers less
    // still runs, with those collectives done at once (no overlap), so it is not refused.
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);

    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_size(node, &local_size_);
    MPI_Comm_free(&node);

    comm_ = std::make_unique<MpiComm>(MPI_COMM_WORLD);
}

World::~World() {
    comm_.reset();
    MPI_Finalize();
}

Comm& World::comm() {
    return *comm_;
}
MpiComm& World::mpi_comm() {
    return *comm_;
}

namespace {

void print_error(const std::string& line) {
    std::fprintf(stderr, "trident: error: %s\n", line.c_str());
    std::fflush(stderr);
}

// "rank 3", "ranks 1, 3", "ranks 0-3, 6": ranks in increasing order.
std::string describe_ranks(const std::vector<int>& ranks) {
    std::string text = ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size();) {
        std::size_t j = i;
        while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
        if (i > 0) text += ", ";
        text += std::to_string(ranks[i]);
        if (j > i) {
            text += '-';
            text += std::to_string(ranks[j]);
        }
        i = j + 1;
    }
    return text;
}

// Every rank's message, on rank 0 (empty elsewhere): one MPI_Gather of the lengths, one
// MPI_Gatherv of the text.
std::vector<std::string> gather_messages(const std::string& message, int rank, int size) {
    constexpr std::size_t kLongest = 1 << 16;  // keeps the total within an int
    const std::string mine = message.substr(0, kLongest);
    int length = static_cast<int>(mine.size());
    std::vector<int> lengths(rank == 0 ? size : 0), offsets(lengths.size());
    MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    int total = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) {
        offsets[r] = total;
        total += lengths[r];
    }
    std::vector<char> text(std::max(total, 1));
    MPI_Gatherv(mine.data(), length, MPI_CHAR, text.data(), lengths.data(), offsets.data(),
                MPI_CHAR, 0, MPI_COMM_WORLD);
    std::vector<std::string> messages;
    for (std::size_t r = 0; r < lengths.size(); ++r)
        messages.emplace_back(text.data() + offsets[r], lengths[r]);
    return messages;
}

void report_agreed(const std::string& message, int rank, int size) {
    const std::vector<std::string> messages = gather_messages(message, rank, size);
    if (rank != 0) return;
    // Distinct messages in the order of the first rank that hit each.
    std::vector<std::pair<std::string, std::vector<int>>> distinct;
    for (int r = 0; r < size; ++r) {
        if (messages[r].empty()) continue;
        auto it = std::find_if(distinct.begin(), distinct.end(),
                               [&](const auto& d) { return d.first == messages[r]; });
        if (it == distinct.end()) {
            distinct.push_back({messages[r], {r}});
        } else {
            it->second.push_back(r);
        }
    }
    if (distinct.empty()) print_error("a rank failed without saying why");
    for (const auto& [text, ranks] : distinct) {
        if (static_cast<int>(ranks.size()) == size) {
            print_error(text);
        } else {
            print_error(describe_ranks(ranks) + ": " + text);
        }
    }
}

}  // namespace

int report_failure(World& world, const std::string& message, FailureKind kind) {
    switch (kind) {
        case FailureKind::every_rank:
            if (world.rank() == 0) print_error(message);
            break;
        case FailureKind::agreed:
            if (world.size() == 1) {
                print_error(message.empty() ? "failed without saying why" : message);
            } else {
                report_agreed(message, world.rank(), world.size());
            }
            break;
        case FailureKind::this_rank:
            if (world.size() == 1) {
                print_error(message);
            } else {
                print_error("rank " + std::to_string(world.rank()) + ": " + message);
                // The launcher forwards this rank's stderr; an abort at once can kill the
                // forwarding before the line arrives (seen with MPICH's hydra).
                std::this_thread::sleep_for(std::chrono::milliseconds(250));
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            break;
    }
    return 1;
}

bool any_rank_failed(World& world, bool failed) {
    if (world.size() == 1) return failed;
    int flag = failed ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return flag != 0;
}

}  // namespace trident::parallel
