// AdamW's element update (see adamw.h).
#include "optim/adamw.h"

#include "kernels/host_adamw.h"

namespace trident::optim {

AdamW::AdamW(float beta1, float beta2, float eps) : beta1_(beta1), beta2_(beta2), eps_(eps) {}

void AdamW::update(kernels::Ops& ops, const Segment& s, const Hyper& h) const {
    ops.adamw_update(s.master, s.grads, s.state[0], s.state[1], s.count, h.lr, beta1_, beta2_, eps_,
                     s.weight_decay, h.step, h.grad_scale, s.params);
}

void AdamW::update_host(const Segment& s, const float* grads, const Hyper& h, std::size_t begin,
                        std::size_t end) const {
    const kernels::AdamwFactors f(h.lr, beta1_, beta2_, eps_, s.weight_decay, h.step);
    kernels::adamw_elements(f, s.master, grads, s.state[0], s.state[1], begin, end, h.grad_scale,
                            nullptr);
}

}  // namespace trident::optim
