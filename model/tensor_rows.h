// This rank's rows of the residual stream, and the tensor group's exchanges of them: Megatron's
// f and g (Shoeybi et al., arXiv 1909.08053, §3) and their sequence-parallel forms (Korthikanti
// et al., arXiv 2205.05198, §4.2.2).
//
// Without sequence parallelism every tensor rank holds all N rows of the residual stream:
// before a column-split linear nothing moves (f forward is the identity) and after a row-split
// one the partial outputs are all-reduced (g). With it each rank holds its R = N/M rows: they
// are all-gathered before a column-split linear and the partial outputs reduce-scattered back
// to rows after a row-split one. The backward of each is the other.
//
// Under sequence parallelism the reduce-scatter runs as a ring of M steps (below), whose sums
// this code orders: block b of the result is ((p[b−1] + p[b−2]) + …) + p[b], p[q] rank q's
// partial, ranks counted modulo M. The split linears compute their GEMMs on the exchanged rows
// block by block (R rows each; OpenBLAS's sgemm does not give a block of rows the bits of the
// whole GEMM at every size). How the blocks' GEMMs meet the exchange is a strategy
// (RowExchange): serial, they run before the reduce-scatter's ring or after the whole
// all-gather; overlapped (parallel.tp_overlap), between the ring's steps (collective matmul,
// Wang et al. 2023, "Overlap communication with dependent computation via decomposition"):
// the all-gather's step s hands the caller the block that has arrived while the next one
// moves, and the reduce-scatter's step s asks the caller for the partial block it adds while
// the running sum moves on. The same GEMMs and the same sums either way, so the results are
// bitwise the same (docs/ARCHITECTURE.md, "Tensor parallelism").
//
// Under context parallelism a rank's rows are its tokens of each sequence (model/context_split.h),
// not consecutive positions: dropout draws each element's mask at its index in the whole
// microbatch (B, seq_len, width), so that every split draws the masks of one process. The rows
// are described as runs of consecutive rows of the whole (RowRun).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "model/dims.h"
#include "parallel/comm.h"

namespace trident::model {

// Whose exchange a piece overlaps: the tensor group's ring steps under a GEMM's pieces, the
// expert group's dispatch under an MoE layer's shared experts, or its combine of the input
// gradients under the layer's weight gradients (model/moe_mlp.cpp).
enum class PieceKind { tensor, expert, expert_combine, attention_wgrad };

// A piece of an overlapped exchange, for the trace (src/io/chrome_trace.h): the caller's
// compute on a block of rows, or the transfer of one (when and on which thread it moved,
// parallel::Request::Transfer; thread 0: the calling thread, from `issued_us`).
struct PieceSpan {
    PieceKind kind = PieceKind::tensor;
    bool transfer = false;
    int block = 0;
    double start_us = 0, end_us = 0;
    long thread = 0;
    double issued_us = 0;
};

class TensorRows;

// How the blocks of an exchange of rows meet the caller's GEMM on them (see the top of this
// file): SerialExchange, or OverlappedExchange under parallel.tp_overlap.
class RowExchange {
public:
    using BlockFn = std::function<void(int)>;
    virtual ~RowExchange() = default;
    // TensorRows::all_rows and reduce_rows under sequence parallelism: `count` elements a block.
    virtual void gather(const TensorRows& rows, kernels::ConstPtr mine, kernels::Ptr all,
                        std::size_t count, const BlockFn& arrived) const = 0;
    virtual void reduce(const TensorRows& rows, kernels::Ptr partial, kernels::Ptr mine,
                        std::size_t count, kernels::Ptr sums, const BlockFn& make) const = 0;
};

class TensorRows {
public:
    // `positions`: the sequence positions of this rank's T tokens (model/context_split.h).
    TensorRows(kernels::Ops& ops, parallel::Comm& tensor, const Dims& dims,
               const std::vector<int32_t>& positions);

    parallel::Comm& group() const { return tensor_; }
    const Dims& dims() const { return d_; }

    // Called with a block b of rows (rows b·R .. b·R + R − 1 of N) of an exchange.
    using BlockFn = RowExchange::BlockFn;

    // All rows (N, width) of this rank's (R, width): all-gathered into `all` under sequence
    // parallelism, else `mine` itself. With `arrived` (sequence parallelism only), arrived(b)
    // is called for each block b once it is in `all`: under tp_overlap as the ring brings it,
    // this rank's first, while the next one moves.
    kernels::ConstPtr all_rows(kernels::ConstPtr mine, kernels::Ptr all, std::size_t width,
                               const BlockFn& arrived = {}) const;
    // This rank's rows (R, width) of the sum over the group of `partial` (N, width):
    // reduce-scattered into `mine` as a ring under sequence parallelism (the order of the sums
    // above), else all-reduced in place. `sums` (2, R, width): the ring's running sums, the
    // one going out and the one coming in (a part's scratch, "ring_sums"). With `make`
    // (sequence parallelism only),
    // make(b) is called to write block b of `partial`: under tp_overlap just before the ring
    // adds it, while the running sums move; else before the ring. Without, `partial` is
    // whole already. `partial` is only read.
    kernels::Ptr reduce_rows(kernels::Ptr partial, kernels::Ptr mine, std::size_t width,
                             kernels::Ptr sums, const BlockFn& make = {}) const;
    // Where the pieces of overlapped exchanges are reported (none: nowhere).
    void set_trace(std::function<void(const PieceSpan&)> trace) { trace_ = std::move(trace); }
    // The model's overlapped work, reported there: now (when tracing; for a transfer's issue
    // time), fn() as a compute piece of `kind`, and a transfer of `kind` waited for.
    double trace_now() const;
    void run_traced(PieceKind kind, int block, const std::function<void()>& fn) const;
    void wait_traced(PieceKind kind, int block, parallel::Request& transfer,
                     double issued_us) const;

    // Dropout on this rank's rows (R, H) of the residual stream, in place.
    void dropout(kernels::Ptr x, float drop, uint64_t seed) const;
    // The gradient before a dropout site from the one after it (R, H): `dout` itself without
    // dropout, else dout through the site's mask, written to `out`.
    kernels::ConstPtr through_dropout(kernels::ConstPtr dout, kernels::Ptr out, float drop,
                                      uint64_t seed) const;

    // Calls fn(local, whole, count) for each run of an input (N, width) that is contiguous in
    // the whole microbatch's (B, seq_len, whole_width), where this rank holds columns
    // [column, column + width) of each row: element offsets into each.
    void for_each_run(std::size_t width, std::size_t whole_width, std::size_t column,
                      const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) const;

private:
    friend class SerialExchange;
    friend class OverlappedExchange;

    // The ring's steps (both strategies): the all-gather with `arrived` called for each block
    // as it comes, and the reduce-scatter, `make` called for each block just before its step
    // adds it (null: `partial` whole already).
    void ring_gather(kernels::ConstPtr mine, kernels::Ptr all, std::size_t count,
                     const BlockFn& arrived) const;
    void ring_reduce(kernels::Ptr partial, kernels::Ptr mine, std::size_t count, kernels::Ptr sums,
                     const BlockFn* make) const;
    // Consecutive rows of the whole microbatch: the first local row, its row in the whole,
    // and how many.
    struct RowRun {
        std::size_t local, whole, rows;
    };
    std::vector<RowRun> runs_of(std::size_t first, std::size_t count,
                                const std::vector<int32_t>& positions) const;
    // The ring's neighbours and rank q's block b of rows (R·width elements).
    int next() const { return (tensor_.rank() + 1) % tensor_.size(); }
    int previous() const { return (tensor_.rank() + tensor_.size() - 1) % tensor_.size(); }
    int block_after(int steps) const { return (tensor_.rank() + steps) % tensor_.size(); }
    // Runs fn(b) for block b, reported as a compute piece when tracing.
    void run_piece(const BlockFn& fn, int block) const;
    // Waits for one ring step's transfer of block b, reported when tracing.
    void finish_step(parallel::Request& step, int block, double issued_us) const;

    kernels::Ops& ops_;
    parallel::Comm& tensor_;
    Dims d_;
    std::vector<RowRun> mine_;  // this rank's R rows of the residual stream
    std::vector<RowRun> all_;   // all N rows
    std::unique_ptr<RowExchange> exchange_;
    std::function<void(const PieceSpan&)> trace_;
};

}  // namespace trident::model
