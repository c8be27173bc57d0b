// AdamW, clipping and ZeRO sharding (see adamw.h).
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace trident::optim {

AdamW::AdamW(kernels::Ops& ops, const model::ParamLayout& layout, const config::TrainingConfig& cfg,
             const OptimizerGroups& groups, int zero_stage, model::FlatBuffer& params,
             model::FlatBuffer& grads, std::size_t bucket_size, Overlap overlap)
    : ops_(ops),
      cfg_(cfg),
      params_(params),
      grads_(grads),
      tensor_(groups.tensor ? *groups.tensor : solo_),
      pipeline_(groups.pipeline ? *groups.pipeline : solo_),
      data_(groups.data ? *groups.data : solo_),
      zero_stage_(zero_stage),
      size_(grads.size()),
      layout_total_(layout.total()) {
    const std::size_t D = static_cast<std::size_t>(data_.size());
    const std::size_t r = static_cast<std::size_t>(data_.rank());
    if (zero_stage_ >= 2) {  // the units, each a multiple of D
        for (const auto& [begin, end] : layout.units())
            buckets_.push_back(Bucket{begin, end - begin, 0, 0});
    } else {  // buckets of a multiple of D floats (the buffer is one), counted from the end
        const std::size_t bucket = std::max(D, bucket_size / D * D);
        for (std::size_t end = size_; end > 0;) {
            const std::size_t begin = end > bucket ? end - bucket : 0;
            buckets_.insert(buckets_.begin(), Bucket{begin, end - begin, 0, 0});
            end = begin;
        }
    }
    for (Bucket& b : buckets_) {
        const std::size_t part = owned_part(b);
        b.mine = zero_stage_ >= 1 ? b.begin + r * part : b.begin;
        b.state = owned_;
        owned_ += part;
    }
    if (D > 1) overlap_ = Overlap{overlap.grad_reduce, overlap.param_gather && zero_stage_ >= 1};
    if (zero_stage_ >= 2)
        units_ = std::make_unique<ZeroUnits>(ops, params_, grads_, data_, overlap_.grad_reduce,
                                             overlap_.param_gather);
    flight_.resize(buckets_.size());
    const std::size_t allocated_before = ops.allocated_bytes();
    master_ = kernels::DeviceBuffer(ops, owned_);
    m_ = kernels::DeviceBuffer(ops, owned_);
    v_ = kernels::DeviceBuffer(ops, owned_);
    state_bytes_ = ops.allocated_bytes() - allocated_before;
    norm_total_ = kernels::DeviceBuffer(ops, 1, kernels::DType::f64);

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
    return zero_stage_ >= 1 ? b.size / static_cast<std::size_t>(data_.size()) : b.size;
}

void AdamW::set_trace(io::TraceRecorder* trace) {
    trace_ = trace;
    if (units_) units_->set_trace(trace);
}

void AdamW::start_step() {
    if (!overlap_.grad_reduce || units_) return;
    in_step_ = true;
    for (InFlight& f : flight_) {  // the gathers of the last update may still be under way
        f.final = 0;
        f.reducing = false;
    }
    // The padding past the layout's tensors gets no gradient: it is final from the start.
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const Bucket& bucket = buckets_[b];
        if (bucket.begin + bucket.size > layout_total_)
            grads_final(std::max(bucket.begin, layout_total_), bucket.begin + bucket.size);
    }
}

void AdamW::grads_needed(std::size_t begin, std::size_t end) {
    if (units_) units_->grads_needed(begin, end);
}

void AdamW::grads_final(std::size_t begin, std::size_t end) {
    if (units_) {
        units_->grads_final(begin, end);
        return;
    }
    if (!in_step_) return;
    poll();
    // Backward order, as the buckets complete: the same order on every replica.
    for (std::size_t b = buckets_.size(); b-- > 0;) {
        const Bucket& bucket = buckets_[b];
        const std::size_t lo = std::max(begin, bucket.begin);
        const std::size_t hi = std::min(end, bucket.begin + bucket.size);
        if (lo >= hi) continue;
        flight_[b].final += hi - lo;
        if (flight_[b].final == bucket.size) start_reduction(b);
    }
}

void AdamW::start_reduction(std::size_t b) {
    const Bucket& bucket = buckets_[b];
    InFlight& f = flight_[b];
    f.reducing = true;
    f.reduction_start = io::TraceRecorder::now_us();
    f.reduction = zero_stage_ == 0
                      ? data_.iall_reduce(grads_.at(bucket.begin), bucket.size)
                      : data_.ireduce_scatter(grads_.at(bucket.begin), grads_.at(bucket.mine),
                                              owned_part(bucket));
}

void AdamW::finish_reduction(std::size_t b) {
    InFlight& f = flight_[b];
    const bool under_way = !f.reduction.done();
    f.reduction.wait();
    if (under_way && trace_ && trace_->recording())
        trace_->add(io::SpanKind::reduce_scatter, -1, static_cast<int>(b), f.reduction_start,
                    io::TraceRecorder::now_us());
    f.reduction_start = 0;
}

void AdamW::finish_gather(std::size_t b) {
    InFlight& f = flight_[b];
    const bool under_way = !f.gather.done();
    f.gather.wait();
    if (under_way && trace_ && trace_->recording())
        trace_->add(io::SpanKind::all_gather, -1, static_cast<int>(b), f.gather_start,
                    io::TraceRecorder::now_us());
}

void AdamW::poll() {
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
        InFlight& f = flight_[b];
        if (!f.reduction.done() && f.reduction.test() && trace_ && trace_->recording())
            trace_->add(io::SpanKind::reduce_scatter, -1, static_cast<int>(b), f.reduction_start,
                        io::TraceRecorder::now_us());
        if (!f.gather.done() && f.gather.test() && trace_ && trace_->recording())
            trace_->add(io::SpanKind::all_gather, -1, static_cast<int>(b), f.gather_start,
                        io::TraceRecorder::now_us());
    }
}

void AdamW::reduce_gradients() {
    if (units_) {
        units_->finish_reductions();
        return;
    }
    if (!in_step_) {  // not overlapped: one call after another, in backward order
        for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {
            if (zero_stage_ == 0)
                data_.all_reduce(grads_.at(b->begin), b->size);
            else  // in place: this rank's part of the bucket's sum lands where it is
                data_.reduce_scatter(grads_.at(b->begin), grads_.at(b->mine), owned_part(*b));
        }
        return;
    }
    for (std::size_t b = buckets_.size(); b-- > 0;)
        if (!flight_[b].reducing) start_reduction(b);
    for (std::size_t b = buckets_.size(); b-- > 0;) finish_reduction(b);
    in_step_ = false;
}

void AdamW::params_needed(std::size_t begin, std::size_t end) {
    if (zero_stage_ == 3) {
        units_->params_needed(begin, end);
        return;
    }
    poll();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const Bucket& bucket = buckets_[b];
        if (begin < bucket.begin + bucket.size && bucket.begin < end && !flight_[b].gather.done())
            finish_gather(b);
    }
}

void AdamW::params_prefetch(std::size_t begin, std::size_t end) {
    if (zero_stage_ == 3) units_->params_prefetch(begin, end);
}

void AdamW::params_done(std::size_t begin, std::size_t end) {
    if (zero_stage_ == 3) units_->params_done(begin, end);
}

void AdamW::finish_param_gather() {
    for (std::size_t b = 0; b < buckets_.size(); ++b) finish_gather(b);
}

double AdamW::grad_norm() const {
    // Every range's sum of squares lands in one device total, read once.
    double* device_sum = static_cast<double*>(norm_total_.data().data);
    ops_.zero(norm_total_.data(), 1);
    for (const Range& r : ranges_)
        if (r.counted) ops_.add_sum_of_squares(device_sum, grads_.owned(r.offset), r.count);
    double sum = 0;
    ops_.download(&sum, device_sum, sizeof(sum));
    tensor_.all_reduce(&sum, 1);
    pipeline_.all_reduce(&sum, 1);
    if (zero_stage_ >= 1) data_.all_reduce(&sum, 1);  // each replica holds a D-th of the sum
    return std::sqrt(sum);
}

float AdamW::clip_factor(double norm) const {
    if (cfg_.grad_clip <= 0 || norm <= cfg_.grad_clip) return 1.0f;
    return static_cast<float>(cfg_.grad_clip / (norm + 1e-6));
}

void AdamW::step(double lr, float grad_scale) {
    finish_param_gather();  // the previous update's, if the forward left any
    if (step_ == 0)
        for (const Bucket& b : buckets_)
            ops_.convert(master_.f32() + b.state, params_.owned(b.mine), owned_part(b));
    ++step_;
    // Each range's update also rounds its master weights into the parameters.
    for (const Range& r : ranges_)
        ops_.adamw_update(master_.f32() + r.state, grads_.owned(r.offset), m_.f32() + r.state,
                          v_.f32() + r.state, r.count, static_cast<float>(lr),
                          static_cast<float>(cfg_.beta1), static_cast<float>(cfg_.beta2),
                          static_cast<float>(cfg_.eps),
                          r.decay ? static_cast<float>(cfg_.weight_decay) : 0.0f, step_, grad_scale,
                          params_.owned(r.offset));
    if (!gathers_after_update()) return;  // stage 3 gathers each unit as it is needed
    if (!overlap_.param_gather) {
        gather_params();
        return;
    }
    // In buffer order, as the next forward reads them; it waits for each (params_needed).
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const Bucket& bucket = buckets_[b];
        flight_[b].gather_start = io::TraceRecorder::now_us();
        flight_[b].gather = data_.iall_gather(params_.at(bucket.mine), params_.at(bucket.begin),
                                              owned_part(bucket));
    }
}

void AdamW::gather_params() {
    if (!gathers_after_update()) return;
    for (const Bucket& b : buckets_)
        data_.all_gather(params_.at(b.mine), params_.at(b.begin), owned_part(b));
}

void AdamW::params_from_master() {
    for (const Bucket& b : buckets_)
        ops_.convert(params_.owned(b.mine), master_.f32() + b.state, owned_part(b));
    gather_params();
}

AdamW::State AdamW::state() const {
    State s;
    s.step = step_;
    s.master.assign(size_, 0.0f);
    s.m.assign(size_, 0.0f);
    s.v.assign(size_, 0.0f);
    for (const Bucket& b : buckets_) {
        const std::size_t part = owned_part(b);
        if (step_ == 0)
            ops_.copy_to_host(s.master.data() + b.mine, params_.owned(b.mine), part);
        else
            ops_.copy_to_host(s.master.data() + b.mine, master_.data() + b.state, part);
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
