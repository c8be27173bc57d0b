// Buckets, their reductions and gathers, ZeRO 0-3 (see data_parallel.h).
#include "data_parallel/data_parallel.h"

#include <algorithm>
#include <utility>

#include "kernels/error.h"

namespace trident::data_parallel {

model::BufferPlan buffer_plan(int zero_stage, const parallel::Comm& shard,
                              const parallel::Comm& expert_shard, bool sharded_accumulation) {
    model::BufferPlan plan;
    plan.multiple = static_cast<std::size_t>(shard.size());
    plan.replica = shard.rank();
    plan.expert_multiple = static_cast<std::size_t>(expert_shard.size());
    plan.expert_replica = expert_shard.rank();
    plan.shard_grads = zero_stage >= 2;
    plan.shard_params = zero_stage >= 3;
    plan.grads_every_microbatch = zero_stage >= 2 && sharded_accumulation;
    return plan;
}

namespace {

// Buckets of a multiple of `ranks` elements covering [begin, end) (whose size is one), counted
// from its end, before those already in `buckets`.
void add_buckets(std::vector<Bucket>& buckets, std::size_t begin, std::size_t end,
                 std::size_t ranks, std::size_t bucket_size, bool experts) {
    const std::size_t bucket = std::max(ranks, bucket_size / ranks * ranks);
    std::vector<Bucket> run;
    for (std::size_t hi = end; hi > begin;) {
        const std::size_t lo = hi - begin > bucket ? hi - bucket : begin;
        run.insert(run.begin(), Bucket{lo, hi - lo, 0, 0, experts});
        hi = lo;
    }
    buckets.insert(buckets.begin(), run.begin(), run.end());
}

}  // namespace

std::vector<Bucket> make_buckets(const std::vector<model::ModelUnit>& units, std::size_t size,
                                 int zero_stage, std::size_t D, std::size_t r,
                                 std::size_t bucket_size, const ExpertRuns& experts) {
    std::vector<Bucket> buckets;
    if (zero_stage >= 2) {  // the units, each a multiple of D, cut at the experts' runs
        auto run = experts.runs.begin();
        for (const model::ModelUnit& u : units) {
            auto [begin, end] = u.trainable;
            for (; run != experts.runs.end() && run->first < end; ++run) {
                if (begin < run->first) buckets.push_back(Bucket{begin, run->first - begin, 0, 0});
                buckets.push_back(Bucket{run->first, run->second - run->first, 0, 0, true});
                begin = run->second;
            }
            if (begin < end) buckets.push_back(Bucket{begin, end - begin, 0, 0});
        }
    } else {  // buckets of a multiple of D elements (the buffer is one), counted from the end,
              // apart from the experts' runs
        std::size_t end = size;
        for (auto run = experts.runs.rbegin(); run != experts.runs.rend(); ++run) {
            add_buckets(buckets, run->second, end, D, bucket_size, false);
            add_buckets(buckets, run->first, run->second, experts.ranks, bucket_size, true);
            end = run->first;
        }
        add_buckets(buckets, 0, end, D, bucket_size, false);
    }
    for (Bucket& b : buckets) {
        const std::size_t ranks = b.experts ? experts.ranks : D,
                          rank = b.experts ? experts.rank : r;
        b.owned = zero_stage >= 1 ? b.size / ranks : b.size;
        b.mine = zero_stage >= 1 ? b.begin + rank * b.owned : b.begin;
    }
    return buckets;
}

std::vector<OwnedPart> owned_parts(const std::vector<Bucket>& buckets) {
    std::vector<OwnedPart> parts;
    std::size_t state = 0;
    for (const Bucket& b : buckets) {
        parts.push_back(OwnedPart{b.mine, b.owned, state});
        state += b.owned;
    }
    return parts;
}

DataParallel::DataParallel(kernels::Ops& ops, ModelBuffers model, DataGroups groups,
                           const DataParallelOptions& options, ParamFile* param_file)
    : units_(std::move(model.units)),
      params_(model.params),
      grads_(model.grads),
      group_(groups.shard),
      replicas_(groups.replicas),
      embedding_(groups.embedding),
      expert_shard_(groups.expert_shard),
      zero_stage_(options.zero_stage),
      layout_total_(model.tensors) {
    buckets_ =
        make_buckets(units_, grads_.size(), zero_stage_, static_cast<std::size_t>(group_.size()),
                     static_cast<std::size_t>(group_.rank()), options.bucket_size,
                     ExpertRuns{model.expert_runs, static_cast<std::size_t>(expert_shard_.size()),
                                static_cast<std::size_t>(expert_shard_.rank())});
    owned_ = owned_parts(buckets_);
    for (const OwnedPart& o : owned_) owned_count_ += o.count;
    const Overlap overlap = options.overlap;
    // A frozen model's adapters are too small for their gathers to overlap with anything.
    if (group_.size() > 1)
        overlap_ =
            Overlap{overlap.grad_reduce, overlap.param_gather && zero_stage_ >= 1 && !model.frozen};
    const bool reshard = options.resharding.after_use;
    if (zero_stage_ >= 2)
        zero_units_ =
            std::make_unique<ZeroUnits>(ops, params_, grads_, group_, expert_shard_,
                                        overlap_.grad_reduce, overlap_.param_gather, reshard);
    const auto gather_only = [&](model::FlatBuffer* buffer,
                                 model::UnitRange model::ModelUnit::*range) {
        if (buffer && zero_stage_ == 3)
            gather_only_.push_back(GatherOnly{
                range,
                std::make_unique<ZeroUnits>(ops, *buffer, no_grads_, group_, expert_shard_, false,
                                            overlap.param_gather && group_.size() > 1, reshard)});
    };
    gather_only(model.frozen, &model::ModelUnit::frozen);
    gather_only(model.codes, &model::ModelUnit::codes);
    flight_.resize(buckets_.size());
    set_param_file(param_file);
}

std::vector<std::pair<std::size_t, std::size_t>> DataParallel::owned_ranges() const {
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    for (const OwnedPart& o : owned_) ranges.emplace_back(o.offset, o.count);
    return ranges;
}

void DataParallel::set_trace(io::TraceRecorder* trace) {
    trace_ = trace;
    if (zero_units_) zero_units_->set_trace(trace);
    for (GatherOnly& g : gather_only_) g.units->set_trace(trace);
}

void DataParallel::set_param_file(ParamFile* file) {
    if (file && zero_stage_ != 3) throw Error("internal: only ZeRO-3 offloads its parameters");
    param_file_ = file;
    if (zero_units_) zero_units_->set_param_file(file);
}

void DataParallel::end_span(io::SpanKind kind, std::size_t bucket, const parallel::Request& done,
                            double issued) const {
    if (trace_ && trace_->recording())
        trace_->add_transfer(kind, static_cast<int>(bucket), done.transfer(), issued);
}

// ---- gradients -------------------------------------------------------------------------------

void DataParallel::start_step() {
    deferred_.clear();
    if (!overlap_.grad_reduce || zero_units_) return;
    in_step_ = true;
    for (InFlight& f : flight_) {  // the gathers of the last update may still be under way
        f.final = 0;
        f.reducing = false;
    }
    // The padding past the layout's tensors gets no gradient: it is final from the start.
    for (const Bucket& bucket : buckets_)
        if (bucket.begin + bucket.size > layout_total_)
            range_final(std::max(bucket.begin, layout_total_), bucket.begin + bucket.size);
}

void DataParallel::grads_needed(std::size_t unit) {
    const model::UnitRange r = units_[unit].trainable;
    if (zero_units_ && r.first < r.second) zero_units_->grads_needed(r.first, r.second);
}

void DataParallel::grads_complete(std::size_t unit) {
    const model::ModelUnit& u = units_[unit];
    if (u.trainable.first == u.trainable.second) return;
    // Whole, a tied embedding's gradient is final once summed with its other copy.
    if (u.shared && !grads_.sharded()) {
        deferred_.push_back(unit);
        return;
    }
    show(u.trainable.first, u.trainable.second);
    range_final(u.trainable.first, u.trainable.second);
}

void DataParallel::backward_done() {
    for (std::size_t unit : deferred_) {
        const auto [begin, end] = units_[unit].trainable;
        embedding_.all_reduce(grads_.at(begin), end - begin);
        show(begin, end);
        range_final(begin, end);
    }
    deferred_.clear();
}

void DataParallel::show(std::size_t begin, std::size_t end) {
    if (!observer_) return;
    // Sharded gradients (ZeRO 2 and 3) are whole unit by unit, each in its own allocation.
    if (!grads_.sharded()) return observer_->grads_final(grads_.at(begin), end - begin);
    const auto [first, last] = grads_.units_of(begin, end);
    for (std::size_t u = first; u < last; ++u) {
        const std::size_t lo = std::max(begin, grads_.units()[u].first),
                          hi = std::min(end, grads_.units()[u].second);
        if (lo < hi && grads_.resident(u)) observer_->grads_final(grads_.at(lo), hi - lo);
    }
}

void DataParallel::range_final(std::size_t begin, std::size_t end) {
    if (zero_units_) {
        zero_units_->grads_final(begin, end);
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

void DataParallel::start_reduction(std::size_t b) {
    const Bucket& bucket = buckets_[b];
    InFlight& f = flight_[b];
    f.reducing = true;
    f.reduction_start = io::TraceRecorder::now_us();
    parallel::Comm& group = group_of(bucket);
    f.reduction = zero_stage_ == 0 ? group.iall_reduce(grads_.at(bucket.begin), bucket.size)
                                   : group.ireduce_scatter(grads_.at(bucket.begin),
                                                           grads_.at(bucket.mine), bucket.owned);
}

void DataParallel::finish_reduction(std::size_t b) {
    InFlight& f = flight_[b];
    const bool under_way = !f.reduction.done();
    f.reduction.wait();
    if (under_way) end_span(io::SpanKind::reduce_scatter, b, f.reduction, f.reduction_start);
    f.reduction_start = 0;
}

void DataParallel::poll() {
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
        InFlight& f = flight_[b];
        if (!f.reduction.done() && f.reduction.test())
            end_span(io::SpanKind::reduce_scatter, b, f.reduction, f.reduction_start);
        if (!f.gather.done() && f.gather.test())
            end_span(io::SpanKind::all_gather, b, f.gather, f.gather_start);
    }
}

void DataParallel::reduce_gradients() {
    if (zero_units_) {
        zero_units_->finish_reductions();
    } else if (!in_step_) {  // not overlapped: one call after another, in backward order
        for (auto b = buckets_.rbegin(); b != buckets_.rend(); ++b) {
            if (zero_stage_ == 0)
                group_of(*b).all_reduce(grads_.at(b->begin), b->size);
            else  // in place: this rank's part of the bucket's sum lands where it is
                group_of(*b).reduce_scatter(grads_.at(b->begin), grads_.at(b->mine), b->owned);
        }
    } else {
        for (std::size_t b = buckets_.size(); b-- > 0;)
            if (!flight_[b].reducing) start_reduction(b);
        for (std::size_t b = buckets_.size(); b-- > 0;) finish_reduction(b);
        in_step_ = false;
    }
    sum_over_replicas();
    tie_sharded();
}

// Sharded gradients of a tied embedding: its two copies summed, over the embedding group, on
// each replica's part of it (the first and the last stage hold the same unit, split alike).
void DataParallel::tie_sharded() {
    if (!grads_.sharded()) return;
    for (const model::ModelUnit& unit : units_) {
        if (!unit.shared || unit.trainable.first == unit.trainable.second) continue;
        const std::size_t u = grads_.units_of(unit.trainable.first, unit.trainable.first + 1).first;
        embedding_.all_reduce(grads_.shard_part(u), grads_.part_size(u));
    }
}

void DataParallel::sum_over_replicas() {
    if (replicas_.size() == 1) return;
    for (const OwnedPart& o : owned_) replicas_.all_reduce(grads_.owned(o.offset), o.count);
}

// ---- parameters ------------------------------------------------------------------------------

// A frozen model's own parameters and a 4-bit base's bytes first, then its adapters (the
// trainable buffer).
void DataParallel::params_needed(std::size_t unit, const std::size_t* next) {
    const model::ModelUnit& u = units_[unit];
    for (GatherOnly& g : gather_only_)
        if (const model::UnitRange r = u.*g.range; r.first < r.second)
            g.units->params_needed(r.first, r.second);
    if (u.trainable.first < u.trainable.second) range_needed(u.trainable.first, u.trainable.second);
    if (!next) return;
    const model::ModelUnit& n = units_[*next];
    for (GatherOnly& g : gather_only_)
        if (const model::UnitRange r = n.*g.range; r.first < r.second)
            g.units->params_prefetch(r.first, r.second);
    if (zero_stage_ == 3 && n.trainable.first < n.trainable.second)
        zero_units_->params_prefetch(n.trainable.first, n.trainable.second);
}

void DataParallel::range_needed(std::size_t begin, std::size_t end) {
    if (zero_stage_ == 3) {
        zero_units_->params_needed(begin, end);
        return;
    }
    poll();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const Bucket& bucket = buckets_[b];
        if (begin < bucket.begin + bucket.size && bucket.begin < end && !flight_[b].gather.done())
            finish_gather(b);
    }
}

void DataParallel::params_done(std::size_t unit) {
    const model::ModelUnit& u = units_[unit];
    for (GatherOnly& g : gather_only_)
        if (const model::UnitRange r = u.*g.range; r.first < r.second)
            g.units->params_done(r.first, r.second);
    if (zero_stage_ == 3 && u.trainable.first < u.trainable.second)
        zero_units_->params_done(u.trainable.first, u.trainable.second);
}

void DataParallel::release_params() {
    if (zero_stage_ == 3) zero_units_->release_params();
    for (GatherOnly& g : gather_only_) g.units->release_params();
}

void DataParallel::with_codes_gathered(const std::function<void(const model::ModelUnit&)>& fn) {
    const auto codes =
        std::find_if(gather_only_.begin(), gather_only_.end(),
                     [](const GatherOnly& g) { return g.range == &model::ModelUnit::codes; });
    for (const model::ModelUnit& u : units_) {
        const bool gathers = codes != gather_only_.end() && u.codes.first < u.codes.second;
        if (gathers) codes->units->params_needed(u.codes.first, u.codes.second);
        fn(u);
        if (gathers) codes->units->params_done(u.codes.first, u.codes.second);
    }
    if (codes != gather_only_.end()) codes->units->release_params();
}

void DataParallel::finish_gather(std::size_t b) {
    InFlight& f = flight_[b];
    const bool under_way = !f.gather.done();
    f.gather.wait();
    if (under_way) end_span(io::SpanKind::all_gather, b, f.gather, f.gather_start);
}

void DataParallel::finish_param_gather() {
    for (std::size_t b = 0; b < buckets_.size(); ++b) finish_gather(b);
}

void DataParallel::gather_updated() {
    if (!gathers_after_update()) return;  // stage 3 gathers each unit as it is needed
    if (!overlap_.param_gather) {
        gather_params();
        return;
    }
    // In buffer order, as the next forward reads them; it waits for each (params_needed).
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
        const Bucket& bucket = buckets_[b];
        flight_[b].gather_start = io::TraceRecorder::now_us();
        flight_[b].gather = group_of(bucket).iall_gather(params_.at(bucket.mine),
                                                         params_.at(bucket.begin), bucket.owned);
    }
}

void DataParallel::gather_params() {
    if (!gathers_after_update()) return;
    for (const Bucket& b : buckets_)
        group_of(b).all_gather(params_.at(b.mine), params_.at(b.begin), b.owned);
}

}  // namespace trident::data_parallel
