// AdamW (Loshchilov and Hutter, arXiv 1711.05101), as torch.optim.AdamW computes it:
// bias-corrected moments and decoupled weight decay. Its state per parameter: Adam's first and
// second moments, "exp_avg" and "exp_avg_sq" (torch's names, the checkpoint's). One element
// update: on the device the op set's kernel (Ops::adamw_update), in host memory the same loop
// the CPU backend runs (kernels/host_adamw.h), so both compute the same bits.
#pragma once

#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace trident::optim {

class AdamW final : public Optimizer {
public:
    AdamW(float beta1, float beta2, float eps);

    const char* name() const override { return "adamw"; }
    const std::vector<std::string>& state_names() const override { return names_; }
    void update(kernels::Ops& ops, const Segment& s, const Hyper& h) const override;
    void update_host(const Segment& s, const float* grads, const Hyper& h, std::size_t begin,
                     std::size_t end) const override;

private:
    float beta1_, beta2_, eps_;
    std::vector<std::string> names_{"exp_avg", "exp_avg_sq"};
};

}  // namespace trident::optim
