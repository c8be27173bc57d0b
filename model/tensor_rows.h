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
// Under context parallelism a rank's rows are its tokens of each sequence (model/context_split.h),
// not consecutive positions: dropout draws each element's mask at its index in the whole
// microbatch (B, seq_len, width), so that every split draws the masks of one process. The rows
// are described as runs of consecutive rows of the whole (RowRun).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/ops.h"
#include "model/dims.h"
#include "parallel/comm.h"

namespace trident::model {

class TensorRows {
public:
    // `positions`: the sequence positions of this rank's T tokens (model/context_split.h).
    TensorRows(kernels::Ops& ops, parallel::Comm& tensor, const Dims& dims,
               const std::vector<int32_t>& positions);

    parallel::Comm& group() const { return tensor_; }
    const Dims& dims() const { return d_; }

    // All rows (N, width) of this rank's (R, width): all-gathered into `all` under sequence
    // parallelism, else `mine` itself.
    kernels::ConstPtr all_rows(kernels::ConstPtr mine, kernels::Ptr all, std::size_t width) const;
    // This rank's rows (R, width) of the sum over the group of `partial` (N, width):
    // reduce-scattered into `mine` under sequence parallelism, else all-reduced in place.
    kernels::Ptr reduce_rows(kernels::Ptr partial, kernels::Ptr mine, std::size_t width) const;

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
    // Consecutive rows of the whole microbatch: the first local row, its row in the whole,
    // and how many.
    struct RowRun {
        std::size_t local, whole, rows;
    };
    std::vector<RowRun> runs_of(std::size_t first, std::size_t count,
                                const std::vector<int32_t>& positions) const;

    kernels::Ops& ops_;
    parallel::Comm& tensor_;
    Dims d_;
    std::vector<RowRun> mine_;  // this rank's R rows of the residual stream
    std::vector<RowRun> all_;   // all N rows
};

}  // namespace trident::model
