// Comm: the one interface through which ranks exchange data (docs/ARCHITECTURE.md). Model,
// optimizer and pipeline code call these; an implementation moves the bytes (MPI for host
// buffers, NCCL for GPU buffers). Every call is collective over the group unless it is a
// point-to-point send/recv. Buffers are typed (kernels::DType): the model's tensors (fp32,
// bf16, fp16; 16-bit sums add in fp32 and round each partial sum to the buffer's type, as
// NCCL does) and control data — doubles (a loss, a norm), integers (flags, sizes, signals)
// and bytes (digests) — each moved as what it is. Reductions take the numeric types (sum
// and max); bool and fp8 buffers only move.
//
// Some calls also come non-blocking (isend, iall_reduce, ireduce_scatter, iall_gather): they return
// a Request at once and the communication goes on while the caller computes, until wait() (a
// pipeline's sends; the data-parallel reduction under the backward pass, the parameters'
// gather under the next forward). A non-blocking call gives bitwise the result of its
// blocking form, and calls of one group complete in the order they were made.
//
// Each implementation counts what its calls move, per kind of call, so tests can hold the
// traffic of a step against the papers' formulas.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/dtype.h"

namespace trident::parallel {

struct GroupLabel;  // parallel/watchdog.h

enum class ReduceOp { sum, max };

enum class CommKind {
    all_reduce,
    reduce_scatter,
    all_gather,
    broadcast,
    send,
    recv,
    all_to_all,
    count_
};

// Per kind of call: how many calls, and how many elements (and bytes) of payload this rank
// handed in (all_reduce/broadcast/send/recv: `count`; reduce_scatter and all_to_all: the
// full input, size*count; all_gather: its own contribution, count).
struct CommStats {
    uint64_t calls[static_cast<int>(CommKind::count_)] = {};
    uint64_t elements[static_cast<int>(CommKind::count_)] = {};
    uint64_t bytes[static_cast<int>(CommKind::count_)] = {};

    uint64_t calls_of(CommKind k) const { return calls[static_cast<int>(k)]; }
    uint64_t elements_of(CommKind k) const { return elements[static_cast<int>(k)]; }
    uint64_t bytes_of(CommKind k) const { return bytes[static_cast<int>(k)]; }
    CommStats& operator+=(const CommStats& o) {
        for (int k = 0; k < static_cast<int>(CommKind::count_); ++k) {
            calls[k] += o.calls[k];
            elements[k] += o.elements[k];
            bytes[k] += o.bytes[k];
        }
        return *this;
    }
};

// A non-blocking call under way. Until it has completed (wait() returned, or test() returned
// true) the call's buffers must stay untouched. A default Request has nothing under way; one
// destroyed while under way waits first, also while an exception unwinds: the buffers it
// writes are freed next, and the job still has to report the failure (the peers issued the
// same call, so it completes; a peer that never does is the watchdog's to end).
class Request {
public:
    // Where and when a call's data moved: the kernel's id of the thread that ran it and its
    // start and end in microseconds of the steady clock (io::TraceRecorder's). thread 0: not
    // known (the implementation does not say).
    struct Transfer {
        long thread = 0;
        double start_us = 0, end_us = 0;
    };
    // What an implementation waits on.
    struct Pending {
        virtual ~Pending() = default;
        virtual bool test() = 0;  // whether it has completed, without waiting
        virtual void wait() = 0;  // until it has; throws trident::Error if it failed
        virtual Transfer transfer() const { return {}; }  // once completed
    };

    Request() = default;
    explicit Request(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
    Request(Request&&) noexcept = default;
    Request& operator=(Request&& other) noexcept {
        if (this != &other) {
            finish();
            pending_ = std::move(other.pending_);
        }
        return *this;
    }
    ~Request() { finish(); }

    bool done() const { return !pending_; }
    bool test() {
        if (pending_ && pending_->test()) complete();
        return !pending_;
    }
    void wait() {
        if (!pending_) return;
        pending_->wait();
        complete();
    }
    // The completed call's transfer (see Transfer); none before it completed.
    const Transfer& transfer() const { return transfer_; }

private:
    void complete() {
        transfer_ = pending_->transfer();
        pending_.reset();
    }
    void finish() noexcept {
        if (pending_) {
            try {
                pending_->wait();
            } catch (...) {  // a failed transfer ends the job elsewhere; nothing to free here
            }
        }
        pending_.reset();
    }

    std::unique_ptr<Pending> pending_;
    Transfer transfer_;
};

class Comm {
public:
    virtual ~Comm() = default;

    virtual int rank() const = 0;  // within this group
    virtual int size() const = 0;

    // In place over `count` elements. A group of one returns at once (and counts nothing).
    // The result is bitwise the same on every rank of the group. max does not reliably
    // propagate NaN (sum does): reduce a 0/1 flag to agree on an overflow.
    virtual void all_reduce(kernels::Ptr data, std::size_t count, ReduceOp op = ReduceOp::sum) = 0;
    // in (size*count) summed over the group; rank r receives block r into out (count).
    // out may be this rank's own block of in (in + rank*count), as ZeRO-1 uses it; the
    // other blocks of in are left as they were. in and out are of one type.
    virtual void reduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) = 0;
    // in (count) from every rank, concatenated in rank order into out (size*count).
    // in may be this rank's own block of out (out + rank*count).
    virtual void all_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) = 0;
    virtual void broadcast(kernels::Ptr data, std::size_t count, int root) = 0;
    // in (size*count): block q goes to rank q; out (size*count): block q comes from rank q
    // (MPI_Alltoall; Ulysses' change from a sequence split to a head split). in and out are
    // of one type and must not overlap.
    virtual void all_to_all(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) = 0;
    // all_to_all with a count per rank (MPI_Alltoallv; expert parallelism's token dispatch):
    // in holds send[q] elements for each rank q, out receives recv[q] from each rank q, each
    // packed in rank order. recv[q] here must equal send[this rank] on rank q. Counted as
    // all_to_all, its elements those handed in. in and out are of one type, must not overlap.
    virtual void all_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send,
                              kernels::Ptr out, const std::vector<std::size_t>& recv) = 0;
    // Point to point, peer another rank of the group, tag >= 0 (MPI guarantees up to 32767).
    // send may block until the peer's matching recv begins, at any size: a pipeline must
    // order each pair of neighbours' sends and recvs so that neither waits on the other.
    virtual void send(kernels::ConstPtr data, std::size_t count, int peer, int tag) = 0;
    virtual void recv(kernels::Ptr data, std::size_t count, int peer, int tag) = 0;
    virtual void barrier() = 0;

    // Non-blocking forms (see the top of this file). isend lets a pipeline stage go on
    // without waiting for its neighbour to reach the matching recv.
    virtual Request isend(kernels::ConstPtr data, std::size_t count, int peer, int tag) = 0;
    virtual Request iall_reduce(kernels::Ptr data, std::size_t count,
                                ReduceOp op = ReduceOp::sum) = 0;
    virtual Request ireduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) = 0;
    virtual Request iall_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) = 0;
    // all_to_all_v's (expert parallelism's rows travelling under the shared experts' compute):
    // in and out stay untouched until it is waited for. The default, for communicators without
    // a form of their own, runs the blocking one.
    virtual Request iall_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send,
                                  kernels::Ptr out, const std::vector<std::size_t>& recv) {
        all_to_all_v(in, send, out, recv);
        return {};
    }
    // One step of a collective run as a ring over the group, so that the caller computes
    // between its steps (model/tensor_rows.h, collective matmul): sends `send` (count) to
    // `dest` while `recv` (count) arrives from `source`. Counts nothing: the caller counts the
    // whole collective with count_ring, as its blocking form would. The default, for
    // communicators without a form of their own, is isend + recv (counted as those).
    virtual Request isendrecv(kernels::ConstPtr send, kernels::Ptr recv, std::size_t count,
                              int dest, int source, int tag) {
        Request sent = isend(send, count, dest, tag);
        this->recv(recv, count, source, tag);
        sent.wait();
        return {};
    }
    // Counts a collective of `kind` that a caller ran as isendrecv steps, as its blocking
    // form counts itself (see CommStats).
    void count_ring(CommKind kind, std::size_t elements, kernels::DType dtype) {
        count(kind, elements, dtype);
    }

    const CommStats& stats() const { return stats_; }
    void reset_stats() { stats_ = CommStats{}; }

    // The group's name and members as the stall watchdog reports them (null: unnamed). A
    // communicator over another takes the label of the one it wraps.
    const GroupLabel* label() const { return label_; }
    void set_label(const GroupLabel* label) { label_ = label; }

protected:
    void count(CommKind kind, std::size_t elements, kernels::DType dtype) {
        ++stats_.calls[static_cast<int>(kind)];
        stats_.elements[static_cast<int>(kind)] += elements;
        stats_.bytes[static_cast<int>(kind)] += elements * kernels::size_of(dtype);
    }

private:
    CommStats stats_;
    const GroupLabel* label_ = nullptr;
};

}  // namespace trident::parallel
