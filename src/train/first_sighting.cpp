// Where non-finite values were first seen (see first_sighting.h).
#include "train/first_sighting.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "io/fault_injection.h"

namespace trident::train {

FirstSighting::FirstSighting(kernels::Ops& ops, const parallel::Grid& grid, parallel::Comm& tensor,
                             parallel::Comm& pipeline, parallel::Comm& data_context)
    : ops_(ops),
      shape_(grid.shape()),
      rank_(grid.rank()),
      watching_(tensor.size() * pipeline.size() * data_context.size() > 1),
      tensor_(tensor),
      pipeline_(pipeline),
      data_context_(data_context) {
    if (watching_) sum_ = kernels::DeviceBuffer(ops, 1, kernels::DType::f64);
}

void FirstSighting::start_step(int step) {
    step_ = step;
    planted_ = false;
    loss_seen_ = false;
    if (watching_) ops_.zero(sum_.data(), 1);
}

void FirstSighting::grads_final(kernels::Ptr grads, std::size_t count) {
    if (!planted_ && count > 0 && io::fault::nan_gradient(step_, rank_)) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        ops_.copy_from_host(grads, &nan, 1);
        planted_ = true;
    }
    if (watching_) ops_.add_sum_of_squares(static_cast<double*>(sum_.data().data), grads, count);
}

std::string FirstSighting::find() {
    if (!watching_) return "";
    double sum = 0;
    ops_.download(&sum, sum_.data().data, sizeof sum);
    // The lowest rank that saw each, as the largest of (ranks - rank), 0 for none.
    const int ranks = tensor_.size() * pipeline_.size() * data_context_.size();
    int32_t first[2] = {loss_seen_ ? ranks - rank_ : 0, std::isfinite(sum) ? 0 : ranks - rank_};
    for (parallel::Comm* group : {&tensor_, &pipeline_, &data_context_})
        group->all_reduce(first, 2, parallel::ReduceOp::max);
    const auto where = [&](int32_t seen) {
        const int r = ranks - seen;
        return "rank " + parallel::describe_rank(shape_, r) + ", pipeline stage " +
               std::to_string(parallel::coordinates_of(shape_, r).pp);
    };
    std::string text;
    if (first[1] > 0)
        text = "non-finite gradients on " + where(first[1]) +
               ", the lowest rank to see any, before the data-parallel reduction";
    if (first[0] > 0)
        text += (text.empty() ? "" : "; ") +
                ("a non-finite loss on " + where(first[0]) + ", the lowest rank to see one");
    if (text.empty())
        text =
            "no rank's own loss or gradients were non-finite: their sums over the ranks "
            "overflowed";
    return text;
}

}  // namespace trident::train
