// MpiComm: each Comm call as one MPI call per piece of at most max_chunk elements.
#include "parallel/mpi_comm.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "error.h"

namespace trident::parallel {

namespace {

// A split reduce-scatter packs this many elements (over all ranks' blocks) at a time.
constexpr std::size_t kStagingElements = std::size_t{1} << 26;  // 256 MiB of floats

// MPI's own error handler aborts by default; this only matters where a caller has set
// MPI_ERRORS_RETURN, and then the failure still arrives as an error with the call's name.
void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw Error(std::string("parallel: ") + call + " failed: " + std::string(text, length));
}

// Whether [a, a+a_count) and [b, b+b_count) share an element (compared as addresses, since
// the buffers may be unrelated arrays).
bool overlaps(const float* a, std::size_t a_count, const float* b, std::size_t b_count) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
    return a_count > 0 && b_count > 0 && a0 < b0 + b_count * sizeof(float) &&
           b0 < a0 + a_count * sizeof(float);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::max ? MPI_MAX : MPI_SUM; }

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, std::size_t max_chunk)
    : comm_(comm), max_chunk_(std::clamp<std::size_t>(max_chunk, 1, kMaxChunk)) {
    if (comm == MPI_COMM_NULL) throw Error("parallel: MpiComm over MPI_COMM_NULL");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    int* upper_bound = nullptr;
    int found = 0;
    // MPI caches the bound on MPI_COMM_WORLD only (and it holds for every communicator).
    check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper_bound, &found), "MPI_Comm_get_attr");
    if (found && upper_bound) tag_upper_bound_ = *upper_bound;
}

MpiComm::~MpiComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
}

void MpiComm::all_reduce(float* data, std::size_t count, ReduceOp op) {
    if (size_ == 1) return;
    Comm::count(CommKind::all_reduce, count);
    for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
        const std::size_t n = std::min(max_chunk_, count - offset);
        check(MPI_Allreduce(MPI_IN_PLACE, data + offset, static_cast<int>(n), MPI_FLOAT, mpi_op(op),
                            comm_),
              "MPI_Allreduce");
    }
}

void MpiComm::reduce_scatter(const float* in, float* out, std::size_t count) {
    const std::size_t total = count * static_cast<std::size_t>(size_);
    if (size_ == 1) {
        if (in != out) std::memmove(out, in, count * sizeof(float));
        return;
    }
    Comm::count(CommKind::reduce_scatter, total);
    if (count <= max_chunk_) {
        // MPI forbids the output inside the input; reduce into scratch and copy then.
        const bool overlap = overlaps(in, total, out, count);
        float* target = out;
        if (overlap) {
            scratch_.resize(count);
            target = scratch_.data();
        }
        check(MPI_Reduce_scatter_block(in, target, static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                                       comm_),
              "MPI_Reduce_scatter_block");
        if (overlap) std::memcpy(out, target, count * sizeof(float));
        return;
    }
    // Too large for one call: piece by piece, each piece's blocks packed side by side. In
    // place, the output written so far is this rank's own block up to `offset`, which later
    // pieces no longer read; any other overlap would overwrite input not yet packed.
    if (overlaps(in, total, out, count) && out != in + static_cast<std::size_t>(rank_) * count)
        throw Error("parallel: reduce_scatter of " + std::to_string(count) +
                    " floats per rank: the output overlaps the input other than at this "
                    "rank's own block");
    const std::size_t piece =
        std::min(max_chunk_, std::max<std::size_t>(1, kStagingElements / size_));
    for (std::size_t offset = 0; offset < count; offset += piece) {
        const std::size_t n = std::min(piece, count - offset);
        scratch_.resize(n * size_);
        for (int r = 0; r < size_; ++r)
            std::memcpy(scratch_.data() + r * n, in + r * count + offset, n * sizeof(float));
        check(MPI_Reduce_scatter_block(scratch_.data(), out + offset, static_cast<int>(n),
                                       MPI_FLOAT, MPI_SUM, comm_),
              "MPI_Reduce_scatter_block");
    }
}

void MpiComm::all_gather(const float* in, float* out, std::size_t count) {
    if (size_ == 1) {
        if (in != out) std::memmove(out, in, count * sizeof(float));
        return;
    }
    Comm::count(CommKind::all_gather, count);
    const bool in_place = in == out + static_cast<std::size_t>(rank_) * count;
    const float* source = in;
    if (!in_place && overlaps(in, count, out, count * size_)) {
        scratch_.assign(in, in + count);
        source = scratch_.data();
    }
    if (count <= max_chunk_) {
        check(MPI_Allgather(in_place ? MPI_IN_PLACE : source, static_cast<int>(count), MPI_FLOAT,
                            out, static_cast<int>(count), MPI_FLOAT, comm_),
              "MPI_Allgather");
        return;
    }
    // Too large for one call: piece by piece. Each rank's piece lands `count` elements after
    // the previous rank's, which one block type with that extent says in a single call.
    for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
        const std::size_t n = std::min(max_chunk_, count - offset);
        MPI_Datatype run, block;
        check(MPI_Type_contiguous(static_cast<int>(n), MPI_FLOAT, &run), "MPI_Type_contiguous");
        check(MPI_Type_create_resized(run, 0, static_cast<MPI_Aint>(count * sizeof(float)), &block),
              "MPI_Type_create_resized");
        check(MPI_Type_commit(&block), "MPI_Type_commit");
        const int code =
            MPI_Allgather(in_place ? MPI_IN_PLACE : source + offset, static_cast<int>(n), MPI_FLOAT,
                          out + offset, 1, block, comm_);
        MPI_Type_free(&block);
        MPI_Type_free(&run);
        check(code, "MPI_Allgather");
    }
}

void MpiComm::broadcast(float* data, std::size_t count, int root) {
    check_root(root);
    if (size_ == 1) return;
    Comm::count(CommKind::broadcast, count);
    for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
        const std::size_t n = std::min(max_chunk_, count - offset);
        check(MPI_Bcast(data + offset, static_cast<int>(n), MPI_FLOAT, root, comm_), "MPI_Bcast");
    }
}

// Point-to-point transfers go as messages of at most max_chunk_ floats (an MPI count is an
// int); a transfer of no elements is still one message, which the peer's recv waits for.
template <typename Fn>
void MpiComm::for_each_message(std::size_t count, Fn fn) const {
    std::size_t offset = 0;
    do {
        const std::size_t n = std::min(max_chunk_, count - offset);
        fn(offset, n);
        offset += n;
    } while (offset < count);
}

void MpiComm::send(const float* data, std::size_t count, int peer, int tag) {
    check_peer(peer, "send");
    check_tag(tag, "send");
    Comm::count(CommKind::send, count);
    for_each_message(count, [&](std::size_t offset, std::size_t n) {
        check(MPI_Ssend(data + offset, static_cast<int>(n), MPI_FLOAT, peer, tag, comm_),
              "MPI_Ssend");
    });
}

void MpiComm::send_async(const float* data, std::size_t count, int peer, int tag) {
    check_peer(peer, "send_async");
    check_tag(tag, "send_async");
    Comm::count(CommKind::send, count);
    for_each_message(count, [&](std::size_t offset, std::size_t n) {
        MPI_Request request;
        check(MPI_Isend(data + offset, static_cast<int>(n), MPI_FLOAT, peer, tag, comm_, &request),
              "MPI_Isend");
        pending_sends_.push_back(request);
    });
}

void MpiComm::wait_sends() {
    if (pending_sends_.empty()) return;
    check(MPI_Waitall(static_cast<int>(pending_sends_.size()), pending_sends_.data(),
                      MPI_STATUSES_IGNORE),
          "MPI_Waitall");
    pending_sends_.clear();
}

void MpiComm::recv(float* data, std::size_t count, int peer, int tag) {
    check_peer(peer, "recv");
    check_tag(tag, "recv");
    Comm::count(CommKind::recv, count);
    for_each_message(count, [&](std::size_t offset, std::size_t n) {
        MPI_Status status;
        check(MPI_Recv(data + offset, static_cast<int>(n), MPI_FLOAT, peer, tag, comm_, &status),
              "MPI_Recv");
        int received = 0;
        MPI_Get_count(&status, MPI_FLOAT, &received);
        if (static_cast<std::size_t>(received) != n)
            throw Error("parallel: recv of " + std::to_string(count) + " floats from rank " +
                        std::to_string(peer) + " (tag " + std::to_string(tag) +
                        ") got a shorter message; the sender's count differs");
    });
}

void MpiComm::barrier() {
    if (size_ == 1) return;
    check(MPI_Barrier(comm_), "MPI_Barrier");
}

void MpiComm::check_peer(int peer, const char* call) const {
    if (peer < 0 || peer >= size_ || peer == rank_)
        throw Error(std::string("parallel: ") + call + " with peer " + std::to_string(peer) +
                    " from rank " + std::to_string(rank_) + " of a group of " +
                    std::to_string(size_) + "; the peer must be another rank of the group");
}

void MpiComm::check_tag(int tag, const char* call) const {
    if (tag < 0 || tag > tag_upper_bound_)
        throw Error(std::string("parallel: ") + call + " with tag " + std::to_string(tag) +
                    "; MPI allows tags 0 to " + std::to_string(tag_upper_bound_) + " here");
}

void MpiComm::check_root(int root) const {
    if (root < 0 || root >= size_)
        throw Error("parallel: broadcast from root " + std::to_string(root) + " in a group of " +
                    std::to_string(size_));
}

}  // namespace trident::parallel
