// AdamW and clipping on this rank's owned parts (see adamw.h).
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "kernels/threads.h"
#include "optim/host_store.h"

namespace trident::optim {

using data_parallel::OwnedPart;

AdamW::AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
             const config::OptimizerConfig& offload, int rank,
             const data_parallel::DataParallel& data_parallel, const NormGroups& groups,
             model::FlatBuffer& params, model::FlatBuffer& grads)
    : ops_(ops),
      cfg_(cfg),
      data_parallel_(data_parallel),
      groups_(groups),
      params_(params),
      grads_(grads),
      size_(grads.size()) {
    const std::size_t owned = data_parallel.owned_count();
    const std::size_t allocated_before = ops.allocated_bytes();
    const auto chunk = static_cast<std::size_t>(offload.offload_chunk);
    if (offload.offload == config::Offload::nvme) {
        auto file = std::make_unique<OffloadStore>(*offload.offload_dir, rank, owned, chunk);
        file_ = file.get();
        store_ = std::move(file);
        chunk_ = kernels::DeviceBuffer(ops, 3 * std::min(owned, store_->chunk()));
        if (data_parallel.param_file()) {  // the updated parameters go to their file
            param_chunk_ =
                kernels::DeviceBuffer(ops, std::min(owned, store_->chunk()), params.dtype());
            param_host_.resize(param_chunk_.bytes());
        }
    } else if (offload.offload == config::Offload::host) {
        store_ = std::make_unique<HostStore>(ops, owned, chunk);
        const std::size_t staged = std::min(owned, store_->chunk());
        host_grads_ = kernels::HostBuffer(ops, staged * sizeof(float));
        staging_ = kernels::HostBuffer(ops, staged * sizeof(std::uint16_t));
        host_threads_ = kernels::thread_count(cfg.threads, "training.threads").count;
    } else {
        master_ = kernels::DeviceBuffer(ops, owned);
        m_ = kernels::DeviceBuffer(ops, owned);
        v_ = kernels::DeviceBuffer(ops, owned);
    }
    state_bytes_ = ops.allocated_bytes() - allocated_before;
    norm_total_ = kernels::DeviceBuffer(ops, 1, kernels::DType::f64);
    add_ranges(layout);
}

void AdamW::add_ranges(const model::ParamLayout& layout) {
    for (const auto& t : layout.tensors()) {
        const bool counted = !layout.held_elsewhere(t);
        for (const OwnedPart& o : data_parallel_.owned()) {
            // The part of the tensor that this rank owns in this part.
            const std::size_t lo = std::max(t.offset, o.offset);
            const std::size_t hi = std::min(t.offset + t.numel, o.offset + o.count);
            if (lo >= hi) continue;
            const std::size_t state = o.state + (lo - o.offset);
            Range* last = ranges_.empty() ? nullptr : &ranges_.back();
            if (last && last->decay == t.decay && last->counted == counted &&
                last->offset + last->count == lo && last->state + last->count == state)
                last->count += hi - lo;
            else
                ranges_.push_back(Range{lo, hi - lo, state, t.decay, counted});
        }
    }
}

double AdamW::grad_norm() const {
    // Every range's sum of squares lands in one device total, read once.
    double* device_sum = static_cast<double*>(norm_total_.data().data);
    ops_.zero(norm_total_.data(), 1);
    for (const Range& r : ranges_)
        if (r.counted) ops_.add_sum_of_squares(device_sum, grads_.owned(r.offset), r.count);
    double sum = 0;
    ops_.download(&sum, device_sum, sizeof(sum));
    groups_.tensor.all_reduce(&sum, 1);
    groups_.pipeline.all_reduce(&sum, 1);
    // Each replica holds a D-th of the sum.
    if (data_parallel_.zero_stage() >= 1) data_parallel_.group().all_reduce(&sum, 1);
    return std::sqrt(sum);
}

float AdamW::clip_factor(double norm) const {
    if (cfg_.grad_clip <= 0 || norm <= cfg_.grad_clip) return 1.0f;
    return static_cast<float>(cfg_.grad_clip / (norm + 1e-6));
}

void AdamW::step(double lr, float grad_scale) {
    if (store_) return step_offloaded(static_cast<float>(lr), grad_scale);
    if (step_ == 0)
        for (const OwnedPart& o : data_parallel_.owned())
            ops_.convert(master_.f32() + o.state, params_.owned(o.offset), o.count);
    ++step_;
    // Each range's update also rounds its master weights into the parameters.
    for (const Range& r : ranges_)
        ops_.adamw_update(master_.f32() + r.state, grads_.owned(r.offset), m_.f32() + r.state,
                          v_.f32() + r.state, r.count, static_cast<float>(lr),
                          static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                          static_cast<float>(cfg_.eps),
                          r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f, step_, grad_scale,
                          params_.owned(r.offset));
}

void AdamW::params_from_master() {
    if (store_) return params_from_store();
    for (const OwnedPart& o : data_parallel_.owned())
        ops_.convert(params_.owned(o.offset), master_.f32() + o.state, o.count);
}

AdamW::State AdamW::state() const {
    if (store_) return state_from_store();
    State s;
    s.step = step_;
    s.master.assign(size_, 0.0f);
    s.m.assign(size_, 0.0f);
    s.v.assign(size_, 0.0f);
    for (const OwnedPart& o : data_parallel_.owned()) {
        if (step_ == 0)
            ops_.copy_to_host(s.master.data() + o.offset, params_.owned(o.offset), o.count);
        else
            ops_.copy_to_host(s.master.data() + o.offset, master_.data() + o.state, o.count);
        ops_.copy_to_host(s.m.data() + o.offset, m_.data() + o.state, o.count);
        ops_.copy_to_host(s.v.data() + o.offset, v_.data() + o.state, o.count);
    }
    return s;
}

void AdamW::restore(const State& s) {
    if (store_) return restore_into_store(s);
    for (const OwnedPart& o : data_parallel_.owned()) {
        ops_.copy_from_host(master_.data() + o.state, s.master.data() + o.offset, o.count);
        ops_.copy_from_host(m_.data() + o.state, s.m.data() + o.offset, o.count);
        ops_.copy_from_host(v_.data() + o.state, s.v.data() + o.offset, o.count);
    }
    step_ = s.step;
}

}  // namespace trident::optim
