// AdamW, clipping and ZeRO-1 sharding (see adamw.h).
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace trident::optim {

AdamW::AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
             const OptimizerGroups& groups, int zero_stage, std::size_t buffer_size,
             std::size_t bucket_size)
    : ops_(ops), cfg_(cfg),
      tensor_(groups.tensor ? *groups.tensor : solo_),
      pipeline_(groups.pipeline ? *groups.pipeline : solo_),
      data_(groups.data ? *groups.data : solo_),
      zero_stage_(zero_stage), size_(buffer_size) {
    const std::size_t D = static_cast<std::size_t>(data_.size());
    const std::size_t r = static_cast<std::size_t>(data_.rank());
    // Buckets of a multiple of D floats (the buffer is one), counted from the end.
    const std::size_t bucket = zero_stage_ == 1 ? std::max(D, bucket_size / D * D) : size_;
    for (std::size_t end = size_; end > 0;) {
        const std::size_t begin = end > bucket ? end - bucket : 0;
        buckets_.insert(buckets_.begin(), Bucket{begin, end - begin, 0, 0});
        end = begin;
    }
    for (Bucket& b : buckets_) {
        const std::size_t part = zero_stage_ == 1 ? b.size / D : b.size;
        b.mine = zero_stage_ == 1 ? b.begin + r * part : b.begin;
        b.state = owned_;
        owned_ += part;
    }
    const std::size_t allocated_before = ops.allocated_bytes();
    master_ = model::DeviceBuffer(ops, owned_);
    m_ = model::DeviceBuffer(ops, owned_);
    v_ = model::DeviceBuffer(ops, owned_);
    state_bytes_ = ops.allocated_bytes() - allocated_before;

    for (const auto& t : layout.tensors()) {
        const bool counted = !layout.held_elsewhere(t);
        for (const Bucket& b : buckets_) {
            const std::size_t part = owned_part(b);
            // The part of the tensor that this rank owns in this bucket.
            const std::size_t lo = std::max(t.offset, b.mine);
            const std::size_t hi = std::min(t.offset + t.numel, b.mine + part);
            if (lo >= hi) continue;
            const std::size_t state = b.state + (lo - b.mine);
            Range* last = ranges_.empty() ? nullptr : &ranges_.back();
            if (last && last->decay == t.decay && last->counted == counted &&
                last->offset + last->count == lo && last->state + last->count == state)
                last->count += hi - lo;
            else
                ranges_.push_back(Range{lo, hi - lo, state, t.decay, counted});
        }
    }
}

std::size_t AdamW::owned_part(const Bucket& b) const {
    return zero_stage_ == 1 ? b.size / static_cast<std::size_t>(data_.size()) : b.size;
}

void AdamW::reduce_gradients(kernels::Ptr grads) {
    if (zero_stage_ == 0) {
        data_.all_reduce(grads, size_);
        return;
    }
    // Backward order; in place: this rank's part of each bucket's sum lands where it is.
    for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b)
        data_.reduce_scatter(grads + b->begin, grads + b->mine, owned_part(*b));
}

double AdamW::grad_norm(kernels::ConstPtr grads) const {
    double sum = 0;
    for (const Range& r : ranges_)
        if (r.counted) sum += ops_.sum_of_squares(grads + r.offset, r.count);
    tensor_.all_reduce(&sum, 1);
    pipeline_.all_reduce(&sum, 1);
    if (zero_stage_ == 1) data_.all_reduce(&sum, 1);  // each replica holds a D-th of the sum
    return std::sqrt(sum);
}

float AdamW::clip_factor(double norm) const {
    if (cfg_.grad_clip <= 0 || norm <= cfg_.grad_clip) return 1.0f;
    return static_cast<float>(cfg_.grad_clip / (norm + 1e-6));
}

void AdamW::step(kernels::Ptr params, kernels::ConstPtr grads, double lr, float grad_scale) {
    if (step_ == 0)
        for (const Bucket& b : buckets_)
            ops_.convert(master_.f32() + b.state, params + b.mine, owned_part(b));
    ++step_;
    // Each range's update also rounds its master weights into the parameters.
    for (const Range& r : ranges_)
        ops_.adamw_update(master_.f32() + r.state, grads + r.offset, m_.f32() + r.state,
                          v_.f32() + r.state, r.count, static_cast<float>(lr),
                          static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                          static_cast<float>(cfg_.eps),
                          r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f, step_,
                          grad_scale, params + r.offset);
    gather_params(params);
}

void AdamW::gather_params(kernels::Ptr params) {
    if (zero_stage_ != 1) return;
    for (const Bucket& b : buckets_) data_.all_gather(params + b.mine, params + b.begin, owned_part(b));
}

void AdamW::params_from_master(kernels::Ptr params) {
    for (const Bucket& b : buckets_)
        ops_.convert(params + b.mine, master_.f32() + b.state, owned_part(b));
    gather_params(params);
}

AdamW::State AdamW::state(kernels::ConstPtr params) const {
    State s;
    s.step = step_;
    s.master.assign(size_, 0.0f);
    s.m.assign(size_, 0.0f);
    s.v.assign(size_, 0.0f);
    for (const Bucket& b : buckets_) {
        const std::size_t part = owned_part(b);
        if (step_ == 0) ops_.copy_to_host(s.master.data() + b.mine, params + b.mine, part);
        else ops_.copy_to_host(s.master.data() + b.mine, master_.data() + b.state, part);
        ops_.copy_to_host(s.m.data() + b.mine, m_.data() + b.state, part);
        ops_.copy_to_host(s.v.data() + b.mine, v_.data() + b.state, part);
    }
    return s;
}

void AdamW::restore(const State& s) {
    for (const Bucket& b : buckets_) {
        const std::size_t part = owned_part(b);
        ops_.copy_from_host(master_.data() + b.state, s.master.data() + b.mine, part);
        ops_.copy_from_host(m_.data() + b.state, s.m.data() + b.mine, part);
        ops_.copy_from_host(v_.data() + b.state, s.v.data() + b.mine, part);
    }
    step_ = s.step;
}

std::vector<std::pair<std::size_t, std::size_t>> AdamW::owned_ranges() const {
    std::vector<std::pair<std::size_t, std::size_t>> owned;
    for (const Bucket& b : buckets_) owned.emplace_back(b.mine, owned_part(b));
    return owned;
}

}  // namespace trident::optim
