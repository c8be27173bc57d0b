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
      total_(ops, 2, kernels::DType::f64) {}

double GradNorm::norm() const {
    // Every range's sum of squares lands in one device total, read once.
    // The experts' own (split experts: each expert rank holds its experts') apart.
    double* device_sum = static_cast<double*>(total_.data().data);
    ops_.zero(total_.data(), 2);
    for (const OwnedRange& r : ranges_)
        if (r.counted)
            ops_.add_sum_of_squares(device_sum + (r.expert ? 1 : 0), grads_.owned(r.offset),
                                    r.count);
    double sums[2] = {0, 0};
    ops_.download(sums, device_sum, sizeof(sums));
    // Unsharded, every expert rank holds the rest alike and its own experts.
    if (data_parallel_.zero_stage() == 0) groups_.experts.all_reduce(&sums[1], 1);
    double sum = sums[0] + sums[1];
    groups_.tensor.all_reduce(&sum, 1);
    groups_.pipeline.all_reduce(&sum, 1);
    // Each rank of the shard group holds its part of the sum, the experts' included (clipping.h).
    if (data_parallel_.zero_stage() >= 1) data_parallel_.group().all_reduce(&sum, 1);
    return std::sqrt(sum);
}

float clip_factor(double max_norm, double norm) {
    if (max_norm <= 0 || norm <= max_norm) return 1.0f;
    return static_cast<float>(max_norm / (norm + 1e-6));
}

}  // namespace trident::optim
