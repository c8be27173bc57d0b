// The residual stream's rows and the tensor group's f and g (see tensor_rows.h).
#include "model/tensor_rows.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

TensorRows::TensorRows(kernels::Ops& ops, parallel::Comm& tensor, const Dims& dims,
                       const std::vector<int32_t>& positions)
    : ops_(ops), tensor_(tensor), d_(dims) {
    const std::size_t first =
        d_.sequence_parallel ? static_cast<std::size_t>(tensor.rank()) * d_.rows_mine() : 0;
    mine_ = runs_of(first, d_.rows_mine(), positions);
    all_ = runs_of(0, d_.rows(), positions);
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

ConstPtr TensorRows::all_rows(ConstPtr mine, Ptr all, std::size_t width) const {
    if (!d_.sequence_parallel) return mine;
    tensor_.all_gather(mine, all, d_.rows_mine() * width);
    return all;
}

Ptr TensorRows::reduce_rows(Ptr partial, Ptr mine, std::size_t width) const {
    if (!d_.sequence_parallel) {
        tensor_.all_reduce(partial, d_.rows() * width);
        return partial;
    }
    tensor_.reduce_scatter(partial, mine, d_.rows_mine() * width);
    return mine;
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
