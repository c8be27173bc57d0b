// The residual stream's rows and the tensor group's f and g (see tensor_rows.h).
#include "model/tensor_rows.h"

#include <chrono>

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

// Serial: the blocks' GEMMs before the reduce-scatter's ring, or after the whole all-gather.
class SerialExchange final : public RowExchange {
public:
    void gather(const TensorRows& rows, ConstPtr mine, Ptr all, std::size_t count,
                const BlockFn& arrived) const override {
        rows.tensor_.all_gather(mine, all, count);
        if (arrived)
            for (int b = 0; b < rows.tensor_.size(); ++b) rows.run_piece(arrived, b);
    }
    void reduce(const TensorRows& rows, Ptr partial, Ptr mine, std::size_t count, Ptr sums,
                const BlockFn& make) const override {
        if (make)
            for (int b = 0; b < rows.tensor_.size(); ++b) rows.run_piece(make, b);
        rows.ring_reduce(partial, mine, count, sums, nullptr);
    }
};

// Overlapped (parallel.tp_overlap): each block's GEMM between the ring's steps.
class OverlappedExchange final : public RowExchange {
public:
    void gather(const TensorRows& rows, ConstPtr mine, Ptr all, std::size_t count,
                const BlockFn& arrived) const override {
        if (!arrived) return rows.tensor_.all_gather(mine, all, count);
        rows.ring_gather(mine, all, count, arrived);
    }
    void reduce(const TensorRows& rows, Ptr partial, Ptr mine, std::size_t count, Ptr sums,
                const BlockFn& make) const override {
        rows.ring_reduce(partial, mine, count, sums, make ? &make : nullptr);
    }
};

TensorRows::TensorRows(kernels::Ops& ops, parallel::Comm& tensor, const Dims& dims,
                       const std::vector<int32_t>& positions)
    : ops_(ops), tensor_(tensor), d_(dims) {
    const std::size_t first =
        d_.sequence_parallel ? static_cast<std::size_t>(tensor.rank()) * d_.rows_mine() : 0;
    mine_ = runs_of(first, d_.rows_mine(), positions);
    all_ = runs_of(0, d_.rows(), positions);
    if (d_.tp_overlap)
        exchange_ = std::make_unique<OverlappedExchange>();
    else
        exchange_ = std::make_unique<SerialExchange>();
}

std::vector<TensorRows::RowRun> TensorRows::runs_of(std::size_t first, std::size_t count,
                                                    const std::vector<int32_t>& positions) const {
    const std::size_t T = static_cast<std::size_t>(d_.T);
    std::vector<RowRun> runs;
    for (std::size_t row = first; row < first + count; ++row) {
        const std::size_t whole = row / T * static_cast<std::size_t>(d_.seq_len) +
                                  static_cast<std::size_t>(positions[row % T]);
        if (!runs.empty() && runs.back().whole + runs.back().rows == whole)
            ++runs.back().rows;
        else
            runs.push_back({row - first, whole, 1});
    }
    return runs;
}

namespace {

// A tag of its own for the ring's steps (the tensor group carries no other messages).
constexpr int kRingTag = 7;

double now_us() {
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

double TensorRows::trace_now() const {
    return trace_ ? now_us() : 0;
}

void TensorRows::run_traced(PieceKind kind, int block, const std::function<void()>& fn) const {
    const double start = trace_now();
    fn();
    if (trace_) trace_(PieceSpan{kind, false, block, start, now_us(), 0, start});
}

void TensorRows::wait_traced(PieceKind kind, int block, parallel::Request& transfer,
                             double issued_us) const {
    transfer.wait();
    if (!trace_) return;
    const parallel::Request::Transfer& moved = transfer.transfer();
    if (moved.thread == 0)
        trace_(PieceSpan{kind, true, block, issued_us, now_us(), 0, issued_us});
    else
        trace_(PieceSpan{kind, true, block, moved.start_us, moved.end_us, moved.thread, issued_us});
}

void TensorRows::run_piece(const BlockFn& fn, int block) const {
    run_traced(PieceKind::tensor, block, [&] { fn(block); });
}

void TensorRows::finish_step(parallel::Request& step, int block, double issued_us) const {
    wait_traced(PieceKind::tensor, block, step, issued_us);
}

ConstPtr TensorRows::all_rows(ConstPtr mine, Ptr all, std::size_t width,
                              const BlockFn& arrived) const {
    if (!d_.sequence_parallel) return mine;
    exchange_->gather(*this, mine, all, d_.rows_mine() * width, arrived);
    return all;
}

Ptr TensorRows::reduce_rows(Ptr partial, Ptr mine, std::size_t width, Ptr sums,
                            const BlockFn& make) const {
    if (!d_.sequence_parallel) {
        tensor_.all_reduce(partial, d_.rows() * width);
        return partial;
    }
    exchange_->reduce(*this, partial, mine, d_.rows_mine() * width, sums, make);
    return mine;
}

// Step s holds block (rank − s) mod M, computes on it and passes it to the next rank while
// block (rank − s − 1) arrives from the previous one.
void TensorRows::ring_gather(ConstPtr mine, Ptr all, std::size_t count,
                             const BlockFn& arrived) const {
    const int M = tensor_.size();
    tensor_.count_ring(parallel::CommKind::all_gather, count, all.dtype);
    const Ptr own = all + static_cast<std::size_t>(tensor_.rank()) * count;
    if (own.data != mine.data) ops_.copy(own, mine, count);
    for (int s = 0; s < M; ++s) {
        const int held = block_after(M - s), coming = block_after(2 * M - s - 1);
        parallel::Request step;
        const double issued = now_us();
        if (s + 1 < M)
            step = tensor_.isendrecv(all + static_cast<std::size_t>(held) * count,
                                     all + static_cast<std::size_t>(coming) * count, count, next(),
                                     previous(), kRingTag);
        run_piece(arrived, held);
        if (s + 1 < M) finish_step(step, coming, issued);
    }
}

// Step s adds this rank's partial block (rank + s + 1) mod M to the running sum that came
// from the next rank and sends it to the previous one; the last step's block is this rank's.
void TensorRows::ring_reduce(Ptr partial, Ptr mine, std::size_t count, Ptr sums,
                             const BlockFn* make) const {
    const Ptr outgoing = sums, incoming = sums + count;
    const int M = tensor_.size();
    tensor_.count_ring(parallel::CommKind::reduce_scatter, count * static_cast<std::size_t>(M),
                       mine.dtype);
    parallel::Request step;
    double issued = 0;
    for (int s = 0; s < M; ++s) {
        const int block = block_after(s + 1);
        const Ptr own = partial + static_cast<std::size_t>(block) * count;
        if (make) run_piece(*make, block);
        if (s > 0) finish_step(step, block, issued);
        const Ptr sum = s + 1 == M ? mine : outgoing;
        if (s > 0) ops_.residual_forward(sum, incoming, own, count);
        if (s + 1 == M) break;
        issued = now_us();
        step = tensor_.isendrecv(s == 0 ? ConstPtr(own) : ConstPtr(sum), incoming, count,
                                 previous(), next(), kRingTag);
    }
}

void TensorRows::dropout(Ptr x, float drop, uint64_t seed) const {
    if (drop == 0) return;
    const std::size_t H = static_cast<std::size_t>(d_.H);
    for (const RowRun& run : mine_)
        ops_.dropout_forward(x + run.local * H, x + run.local * H, run.rows * H, drop, seed,
                             run.whole * H);
}

ConstPtr TensorRows::through_dropout(ConstPtr dout, Ptr out, float drop, uint64_t seed) const {
    if (drop == 0) return dout;
    const std::size_t H = static_cast<std::size_t>(d_.H);
    ops_.zero(out, d_.rows_mine() * H);
    for (const RowRun& run : mine_)
        ops_.dropout_backward(out + run.local * H, dout + run.local * H, run.rows * H, drop, seed,
                              run.whole * H);
    return out;
}

void TensorRows::for_each_run(
    std::size_t width, std::size_t whole_width, std::size_t column,
    const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) const {
    if (width == whole_width) {  // whole rows: a run of rows is one run
        for (const RowRun& run : all_) fn(run.local * width, run.whole * width, run.rows * width);
        return;
    }
    for (const RowRun& run : all_)
        for (std::size_t r = 0; r < run.rows; ++r)
            fn((run.local + r) * width, (run.whole + r) * whole_width + column, width);
}

}  // namespace trident::model
