// The global gradient norm and clipping (see clipping.h).
#include "optim/clipping.h"

#include <cmath>
#include <utility>

namespace trident::optim {

GradNorm::GradNorm(kernels::Ops& ops, std::vector<OwnedRange> ranges,
                   const model::FlatBuffer& grads, const data_parallel::DataParallel& data_parallel,
                   const NormGroups& groups)
    : ops_(ops),
      ranges_(std::move(ranges)),
      grads_(grads),
      data_parallel_(data_parallel),
      groups_(groups),
      total_(ops, 1, kernels::DType::f64) {}

double GradNorm::norm() const {
    // Every range's sum of squares lands in one device total, read once.
    double* device_sum = static_cast<double*>(total_.data().data);
    ops_.zero(total_.data(), 1);
    for (const OwnedRange& r : ranges_)
        if (r.counted) ops_.add_sum_of_squares(device_sum, grads_.owned(r.offset), r.count);
    double sum = 0;
    ops_.download(&sum, device_sum, sizeof(sum));
    groups_.tensor.all_reduce(&sum, 1);
    groups_.pipeline.all_reduce(&sum, 1);
    // Each replica holds a D-th of the sum.
    if (data_parallel_.zero_stage() >= 1) data_parallel_.group().all_reduce(&sum, 1);
    return std::sqrt(sum);
}

float clip_factor(double max_norm, double norm) {
    if (max_norm <= 0 || norm <= max_norm) return 1.0f;
    return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace trident::optim
