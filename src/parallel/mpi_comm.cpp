// MpiComm: each Comm call as one MPI call per piece of at most max_chunk elements.
#include "parallel/mpi_comm.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <numeric>
#include <string>

#include "kernels/dtype.h"
#include "kernels/error.h"
#include "parallel/mpi_types.h"
#include "parallel/mpi_wait.h"
#include "parallel/watchdog.h"

namespace trident::parallel {

namespace {

// A split reduce-scatter packs this many bytes (over all ranks' blocks) at a time.
constexpr std::size_t kStagingBytes = std::size_t{1} << 28;  // 256 MiB

// Whether [a, a+a_bytes) and [b, b+b_bytes) share a byte (compared as addresses, since the
// buffers may be unrelated arrays).
bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
    const auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
    return a_bytes > 0 && b_bytes > 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

const char* bytes(kernels::ConstPtr p) {
    return static_cast<const char*>(p.data);
}

void check_same_type(kernels::ConstPtr in, kernels::Ptr out, const char* call) {
    if (in.dtype != out.dtype)
        throw Error(std::string("internal: ") + call + " from " + kernels::name_of(in.dtype) +
                    " to " + kernels::name_of(out.dtype));
}

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, std::size_t max_chunk)
    : comm_(comm), max_chunk_(std::clamp<std::size_t>(max_chunk, 1, kMaxChunk)) {
    if (comm == MPI_COMM_NULL) throw Error("parallel: MpiComm over MPI_COMM_NULL");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    int* upper_bound = nullptr;
    int found = 0;
    // MPI caches the bound on MPI_COMM_WORLD only (and it holds for every communicator).
    check_mpi(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &upper_bound, &found),
              "MPI_Comm_get_attr");
    if (found && upper_bound) tag_upper_bound_ = *upper_bound;
    if (comm_ == MPI_COMM_WORLD) set_name("world");
}

void MpiComm::set_name(std::string name) {
    MPI_Group group, world;
    check_mpi(MPI_Comm_group(comm_, &group), "MPI_Comm_group");
    check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
    std::vector<int> ranks(static_cast<std::size_t>(size_)), world_ranks(ranks.size());
    for (int r = 0; r < size_; ++r) ranks[static_cast<std::size_t>(r)] = r;
    check_mpi(MPI_Group_translate_ranks(group, size_, ranks.data(), world, world_ranks.data()),
              "MPI_Group_translate_ranks");
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    set_label(make_group_label(std::move(name), std::move(world_ranks)));
}

MpiComm::~MpiComm() {
    if (worker_.joinable()) {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_one();
        worker_.join();
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (worker_comm_ != MPI_COMM_NULL) MPI_Comm_free(&worker_comm_);
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF) MPI_Comm_free(&comm_);
}

void MpiComm::all_reduce(kernels::Ptr data, std::size_t count, ReduceOp op) {
    check_reducible(data.dtype);
    if (size_ == 1) return;
    Comm::count(CommKind::all_reduce, count, data.dtype);
    const Blocked blocked("all_reduce", label());
    all_reduce_on(comm_, data, count, op);
}

Request MpiComm::iall_reduce(kernels::Ptr data, std::size_t count, ReduceOp op) {
    check_reducible(data.dtype);
    if (size_ == 1) return {};
    Comm::count(CommKind::all_reduce, count, data.dtype);
    return start("all_reduce (non-blocking)", [=, this] {
        wait_for_peers(worker_comm_);
        all_reduce_on(worker_comm_, data, count, op);
    });
}

void MpiComm::all_reduce_on(MPI_Comm comm, kernels::Ptr data, std::size_t count,
                            ReduceOp op) const {
    for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
        const std::size_t n = std::min(max_chunk_, count - offset);
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, (data + offset).data, static_cast<int>(n),
                                mpi_type(data.dtype), reduce_op(data.dtype, op), comm),
                  "MPI_Allreduce");
    }
}

void MpiComm::reduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    check_same_type(in, out, "reduce_scatter");
    check_reducible(out.dtype);
    if (size_ == 1) {
        if (in.data != out.data)
            std::memmove(out.data, in.data, count * kernels::size_of(out.dtype));
        return;
    }
    Comm::count(CommKind::reduce_scatter, count * static_cast<std::size_t>(size_), out.dtype);
    const Blocked blocked("reduce_scatter", label());
    reduce_scatter_on(comm_, scratch_, in, out, count);
}

Request MpiComm::ireduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    check_same_type(in, out, "reduce_scatter");
    check_reducible(out.dtype);
    if (size_ == 1) {
        reduce_scatter(in, out, count);
        return {};
    }
    Comm::count(CommKind::reduce_scatter, count * static_cast<std::size_t>(size_), out.dtype);
    return start("reduce_scatter (non-blocking)", [=, this] {
        wait_for_peers(worker_comm_);
        reduce_scatter_on(worker_comm_, worker_scratch_, in, out, count);
    });
}

void MpiComm::reduce_scatter_on(MPI_Comm comm, std::vector<char>& scratch, kernels::ConstPtr in,
                                kernels::Ptr out, std::size_t count) const {
    const std::size_t width = kernels::size_of(out.dtype);
    const std::size_t total = count * static_cast<std::size_t>(size_);
    const MPI_Datatype type = mpi_type(out.dtype);
    const MPI_Op sum = reduce_op(out.dtype, ReduceOp::sum);
    if (count <= max_chunk_) {
        // MPI forbids the output inside the input; reduce into scratch and copy then.
        const bool overlap = overlaps(in.data, total * width, out.data, count * width);
        void* target = out.data;
        if (overlap) {
            scratch.resize(count * width);
            target = scratch.data();
        }
        check_mpi(
            MPI_Reduce_scatter_block(in.data, target, static_cast<int>(count), type, sum, comm),
            "MPI_Reduce_scatter_block");
        if (overlap) std::memcpy(out.data, target, count * width);
        return;
    }
    // Too large for one call: piece by piece, each piece's blocks packed side by side. In
    // place, the output written so far is this rank's own block up to `offset`, which later
    // pieces no longer read; any other overlap would overwrite input not yet packed.
    if (overlaps(in.data, total * width, out.data, count * width) &&
        out.data != (in + static_cast<std::size_t>(rank_) * count).data)
        throw Error("parallel: reduce_scatter of " + std::to_string(count) +
                    " elements per rank: the output overlaps the input other than at this "
                    "rank's own block");
    const std::size_t piece =
        std::min(max_chunk_, std::max<std::size_t>(1, kStagingBytes / width / size_));
    for (std::size_t offset = 0; offset < count; offset += piece) {
        const std::size_t n = std::min(piece, count - offset);
        scratch.resize(n * size_ * width);
        for (int r = 0; r < size_; ++r)
            std::memcpy(scratch.data() + r * n * width, bytes(in + (r * count + offset)),
                        n * width);
        check_mpi(MPI_Reduce_scatter_block(scratch.data(), (out + offset).data, static_cast<int>(n),
                                           type, sum, comm),
                  "MPI_Reduce_scatter_block");
    }
}

void MpiComm::all_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    check_same_type(in, out, "all_gather");
    if (size_ == 1) {
        if (in.data != out.data)
            std::memmove(out.data, in.data, count * kernels::size_of(out.dtype));
        return;
    }
    Comm::count(CommKind::all_gather, count, out.dtype);
    const Blocked blocked("all_gather", label());
    all_gather_on(comm_, scratch_, in, out, count, Wait::blocking);
}

Request MpiComm::iall_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    check_same_type(in, out, "all_gather");
    if (size_ == 1) {
        all_gather(in, out, count);
        return {};
    }
    Comm::count(CommKind::all_gather, count, out.dtype);
    return start("all_gather (non-blocking)", [=, this] {
        all_gather_on(worker_comm_, worker_scratch_, in, out, count, Wait::sleeping);
    });
}

void MpiComm::all_gather_on(MPI_Comm comm, std::vector<char>& scratch, kernels::ConstPtr in,
                            kernels::Ptr out, std::size_t count, Wait wait) const {
    const std::size_t width = kernels::size_of(out.dtype);
    const MPI_Datatype type = mpi_type(out.dtype);
    const bool in_place = in.data == (out + static_cast<std::size_t>(rank_) * count).data;
    const char* source = bytes(in);
    if (!in_place && overlaps(in.data, count * width, out.data, count * size_ * width)) {
        scratch.assign(source, source + count * width);
        source = scratch.data();
    }
    // One MPI call (blocking, or started for the sleeping wait below); its error code.
    std::vector<MPI_Request> started;
    const auto gather = [&](const void* send, std::size_t n, void* recv, int recv_count,
                            MPI_Datatype recv_type) {
        const void* from = in_place ? MPI_IN_PLACE : send;
        if (wait == Wait::blocking)
            return MPI_Allgather(from, static_cast<int>(n), type, recv, recv_count, recv_type,
                                 comm);
        MPI_Request request;
        const int code = MPI_Iallgather(from, static_cast<int>(n), type, recv, recv_count,
                                        recv_type, comm, &request);
        if (code == MPI_SUCCESS) started.push_back(request);
        return code;
    };
    if (count <= max_chunk_) {
        check_mpi(gather(source, count, out.data, static_cast<int>(count), type), "MPI_Allgather");
    } else {
        // Too large for one call: piece by piece. Each rank's piece lands `count` elements
        // after the previous rank's, which one block type with that extent says in a single
        // call (MPI keeps a freed type alive for the calls started with it).
        for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
            const std::size_t n = std::min(max_chunk_, count - offset);
            MPI_Datatype run, block;
            check_mpi(MPI_Type_contiguous(static_cast<int>(n), type, &run), "MPI_Type_contiguous");
            check_mpi(MPI_Type_create_resized(run, 0, static_cast<MPI_Aint>(count * width), &block),
                      "MPI_Type_create_resized");
            check_mpi(MPI_Type_commit(&block), "MPI_Type_commit");
            const int code = gather(source + offset * width, n, (out + offset).data, 1, block);
            MPI_Type_free(&block);
            MPI_Type_free(&run);
            check_mpi(code, "MPI_Allgather");
        }
    }
    if (wait == Wait::sleeping) wait_sleeping(started);
}

void MpiComm::broadcast(kernels::Ptr data, std::size_t count, int root) {
    check_root(root);
    if (size_ == 1) return;
    Comm::count(CommKind::broadcast, count, data.dtype);
    const Blocked blocked("broadcast", label(), root == rank_ ? -1 : root);
    for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
        const std::size_t n = std::min(max_chunk_, count - offset);
        check_mpi(
            MPI_Bcast((data + offset).data, static_cast<int>(n), mpi_type(data.dtype), root, comm_),
            "MPI_Bcast");
    }
}

namespace {

// MPI's int counts and displacements of blocks of `counts` elements packed in rank order.
void mpi_blocks(const std::vector<std::size_t>& counts, std::vector<int>& n, std::vector<int>& at) {
    std::size_t total = 0;
    for (const std::size_t c : counts) {
        if (total + c > static_cast<std::size_t>(INT32_MAX))
            throw Error("internal: all_to_all_v of more than 2^31 elements");
        n.push_back(static_cast<int>(c));
        at.push_back(static_cast<int>(total));
        total += c;
    }
}

}  // namespace

void MpiComm::all_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send,
                           kernels::Ptr out, const std::vector<std::size_t>& recv) {
    check_same_type(in, out, "all_to_all_v");
    if (size_ > 1)
        Comm::count(CommKind::all_to_all, std::accumulate(send.begin(), send.end(), std::size_t{0}),
                    out.dtype);
    all_to_all_v_on(comm_, in, send, out, recv, Wait::blocking);
}

Request MpiComm::iall_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send,
                               kernels::Ptr out, const std::vector<std::size_t>& recv) {
    check_same_type(in, out, "all_to_all_v");
    if (size_ == 1) {
        all_to_all_v(in, send, out, recv);
        return {};
    }
    Comm::count(CommKind::all_to_all, std::accumulate(send.begin(), send.end(), std::size_t{0}),
                out.dtype);
    return start("all_to_all_v (non-blocking)",
                 [=, this] { all_to_all_v_on(worker_comm_, in, send, out, recv, Wait::sleeping); });
}

void MpiComm::all_to_all_v_on(MPI_Comm comm, kernels::ConstPtr in,
                              const std::vector<std::size_t>& send, kernels::Ptr out,
                              const std::vector<std::size_t>& recv, Wait wait) const {
    std::vector<int> send_n, send_at, recv_n, recv_at;
    mpi_blocks(send, send_n, send_at);
    mpi_blocks(recv, recv_n, recv_at);
    const MPI_Datatype type = mpi_type(out.dtype);
    if (wait == Wait::blocking) {
        check_mpi(MPI_Alltoallv(in.data, send_n.data(), send_at.data(), type, out.data,
                                recv_n.data(), recv_at.data(), type, comm),
                  "MPI_Alltoallv");
        return;
    }
    std::vector<MPI_Request> started(1);  // reads the counts above until it completes
    check_mpi(MPI_Ialltoallv(in.data, send_n.data(), send_at.data(), type, out.data, recv_n.data(),
                             recv_at.data(), type, comm, started.data()),
              "MPI_Ialltoallv");
    wait_sleeping(started);
}

void MpiComm::all_to_all(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    check_same_type(in, out, "all_to_all");
    const std::size_t width = kernels::size_of(out.dtype);
    const std::size_t total = count * static_cast<std::size_t>(size_);
    if (overlaps(in.data, total * width, out.data, total * width))
        throw Error("internal: all_to_all with its output overlapping its input");
    if (size_ == 1) {
        if (count) std::memcpy(out.data, in.data, count * width);
        return;
    }
    Comm::count(CommKind::all_to_all, total, out.dtype);
    const MPI_Datatype type = mpi_type(out.dtype);
    if (count <= max_chunk_) {
        check_mpi(MPI_Alltoall(in.data, static_cast<int>(count), type, out.data,
                               static_cast<int>(count), type, comm_),
                  "MPI_Alltoall");
        return;
    }
    // Too large for one call: piece by piece, each rank's piece `count` elements after the
    // previous rank's (one block type with that extent, as all_gather does).
    for (std::size_t offset = 0; offset < count; offset += max_chunk_) {
        const std::size_t n = std::min(max_chunk_, count - offset);
        MPI_Datatype run, block;
        check_mpi(MPI_Type_contiguous(static_cast<int>(n), type, &run), "MPI_Type_contiguous");
        check_mpi(MPI_Type_create_resized(run, 0, static_cast<MPI_Aint>(count * width), &block),
                  "MPI_Type_create_resized");
        check_mpi(MPI_Type_commit(&block), "MPI_Type_commit");
        const int code =
            MPI_Alltoall((in + offset).data, 1, block, (out + offset).data, 1, block, comm_);
        MPI_Type_free(&block);
        MPI_Type_free(&run);
        check_mpi(code, "MPI_Alltoall");
    }
}

// Point-to-point transfers go as messages of at most max_chunk_ elements (an MPI count is an
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

void MpiComm::send(kernels::ConstPtr data, std::size_t count, int peer, int tag) {
    check_peer(peer, "send");
    check_tag(tag, "send");
    Comm::count(CommKind::send, count, data.dtype);
    const Blocked blocked("send", label(), peer);
    for_each_message(count, [&](std::size_t offset, std::size_t n) {
        check_mpi(MPI_Ssend((data + offset).data, static_cast<int>(n), mpi_type(data.dtype), peer,
                            tag, comm_),
                  "MPI_Ssend");
    });
}

namespace {

// The MPI requests of one non-blocking send (one per message), to group rank `peer`.
class MpiPending final : public Request::Pending {
public:
    MpiPending(std::vector<MPI_Request> requests, const GroupLabel* group, int peer)
        : requests_(std::move(requests)), group_(group), peer_(peer) {}
    bool test() override {
        int done = 0;
        check_mpi(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                              MPI_STATUSES_IGNORE),
                  "MPI_Testall");
        return done != 0;
    }
    void wait() override {
        const Blocked blocked("send (non-blocking)", group_, peer_);
        check_mpi(
            MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE),
            "MPI_Waitall");
    }

private:
    std::vector<MPI_Request> requests_;
    const GroupLabel* group_;
    int peer_;
};

// A call run by the worker: done when its future is ready. `operation` names it while the
// caller waits.
class WorkerPending final : public Request::Pending {
public:
    WorkerPending(std::future<void> done, const char* operation, const GroupLabel* group,
                  std::shared_ptr<const Request::Transfer> moved)
        : done_(std::move(done)), operation_(operation), group_(group), moved_(std::move(moved)) {}
    bool test() override {
        return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    }
    void wait() override {
        const Blocked blocked(operation_, group_);
        done_.get();
    }
    // Written by the worker before the future became ready: no race.
    Request::Transfer transfer() const override { return *moved_; }

private:
    std::future<void> done_;
    const char* operation_;
    const GroupLabel* group_;
    std::shared_ptr<const Request::Transfer> moved_;
};

double steady_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

Request MpiComm::isend(kernels::ConstPtr data, std::size_t count, int peer, int tag) {
    check_peer(peer, "isend");
    check_tag(tag, "isend");
    Comm::count(CommKind::send, count, data.dtype);
    std::vector<MPI_Request> requests;
    for_each_message(count, [&](std::size_t offset, std::size_t n) {
        MPI_Request request;
        check_mpi(MPI_Isend((data + offset).data, static_cast<int>(n), mpi_type(data.dtype), peer,
                            tag, comm_, &request),
                  "MPI_Isend");
        requests.push_back(request);
    });
    return Request(std::make_unique<MpiPending>(std::move(requests), label(), peer));
}

Request MpiComm::isendrecv(kernels::ConstPtr send, kernels::Ptr recv, std::size_t count, int dest,
                           int source, int tag) {
    check_peer(dest, "isendrecv");
    check_peer(source, "isendrecv");
    check_tag(tag, "isendrecv");
    check_same_type(send, recv, "isendrecv");
    return start("sendrecv (non-blocking)", [=, this] {
        const MPI_Datatype type = mpi_type(send.dtype);
        const MPI_Comm comm = worker_comm_ == MPI_COMM_NULL ? comm_ : worker_comm_;
        std::vector<MPI_Request> started;
        for_each_message(count, [&](std::size_t offset, std::size_t n) {
            MPI_Request request[2];
            check_mpi(MPI_Irecv((recv + offset).data, static_cast<int>(n), type, source, tag, comm,
                                &request[0]),
                      "MPI_Irecv");
            check_mpi(MPI_Isend((send + offset).data, static_cast<int>(n), type, dest, tag, comm,
                                &request[1]),
                      "MPI_Isend");
            started.insert(started.end(), request, request + 2);
        });
        wait_sleeping(started);
    });
}

Request MpiComm::start(const char* operation, std::function<void()> call) {
    int threads = MPI_THREAD_SINGLE;
    MPI_Query_thread(&threads);
    if (threads < MPI_THREAD_MULTIPLE) {
        call();
        return {};
    }
    if (!worker_.joinable()) {  // the first non-blocking collective of every rank alike
        check_mpi(MPI_Comm_dup(comm_, &worker_comm_), "MPI_Comm_dup");
        worker_ = std::thread([this] { worker_loop(); });
    }
    // The worker notes its thread and when the data moved, for the trace.
    auto moved = std::make_shared<Request::Transfer>();
    auto task = std::make_shared<std::packaged_task<void()>>([call = std::move(call), moved] {
        moved->thread = static_cast<long>(::gettid());
        moved->start_us = steady_us();
        call();
        moved->end_us = steady_us();
    });
    std::future<void> done = task->get_future();
    {
        std::lock_guard lock(mutex_);
        calls_.push_back([task] { (*task)(); });
    }
    wake_.notify_one();
    return Request(std::make_unique<WorkerPending>(std::move(done), operation, label(), moved));
}

void MpiComm::worker_loop() {
    for (;;) {
        std::function<void()> call;
        {
            std::unique_lock lock(mutex_);
            wake_.wait(lock, [&] { return stopping_ || !calls_.empty(); });
            if (calls_.empty()) return;  // stopping, nothing left
            call = std::move(calls_.front());
            calls_.pop_front();
        }
        call();  // a packaged task: an exception goes to its future
    }
}

void MpiComm::recv(kernels::Ptr data, std::size_t count, int peer, int tag) {
    check_peer(peer, "recv");
    check_tag(tag, "recv");
    Comm::count(CommKind::recv, count, data.dtype);
    const Blocked blocked("recv", label(), peer);
    const MPI_Datatype type = mpi_type(data.dtype);
    for_each_message(count, [&](std::size_t offset, std::size_t n) {
        MPI_Status status;
        check_mpi(
            MPI_Recv((data + offset).data, static_cast<int>(n), type, peer, tag, comm_, &status),
            "MPI_Recv");
        int received = 0;
        MPI_Get_count(&status, type, &received);
        if (static_cast<std::size_t>(received) != n)
            throw Error("parallel: recv of " + std::to_string(count) + " elements from rank " +
                        std::to_string(peer) + " (tag " + std::to_string(tag) +
                        ") got a shorter message; the sender's count differs");
    });
}

void MpiComm::barrier() {
    if (size_ == 1) return;
    const Blocked blocked("barrier", label());
    check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
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
