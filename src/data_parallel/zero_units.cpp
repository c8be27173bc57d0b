// ZeRO-2 and ZeRO-3's exchange of gradients and parameters, unit by unit (see zero_units.h).
#include "data_parallel/zero_units.h"

#include <algorithm>

#include "kernels/error.h"

namespace trident::data_parallel {

ZeroUnits::ZeroUnits(kernels::Ops& ops, model::FlatBuffer& params, model::FlatBuffer& grads,
                     parallel::Comm& data, parallel::Comm& experts, bool overlap_reduce,
                     bool overlap_gather, bool reshard_after_use)
    : ops_(ops),
      params_(params),
      grads_(grads),
      data_(data),
      experts_(experts),
      overlap_reduce_(overlap_reduce),
      overlap_gather_(overlap_gather),
      reshard_after_use_(reshard_after_use) {
    gathers_.resize(params_.units().size());
    gather_start_.resize(params_.units().size(), 0.0);
    staging_.resize(params_.units().size());
}

void ZeroUnits::end_span(io::SpanKind kind, std::size_t u, const parallel::Request& done,
                         double issued) const {
    if (trace_ && trace_->recording())
        trace_->add_transfer(kind, static_cast<int>(u), done.transfer(), issued);
}

// ---- gradients -------------------------------------------------------------------------------

bool ZeroUnits::reducing(std::size_t u) const {
    return std::any_of(reductions_.begin(), reductions_.end(),
                       [u](const Pending& p) { return p.unit == u; });
}

void ZeroUnits::grads_needed(std::size_t begin, std::size_t end) {
    const auto [first, last] = grads_.units_of(begin, end);
    for (std::size_t u = first; u < last; ++u) {
        if (grads_.resident(u) && !reducing(u)) continue;  // accumulating already
        if (reducing(u)) finish_reduction(u);
        while (reductions_.size() > 1) finish_reduction(reductions_.front().unit);
        grads_.acquire(u);  // zero-filled
    }
}

void ZeroUnits::grads_final(std::size_t begin, std::size_t end) {
    const auto [first, last] = grads_.units_of(begin, end);
    for (std::size_t u = last; u-- > first;) start_reduction(u);  // backward order
}

void ZeroUnits::start_reduction(std::size_t u) {
    const std::size_t part = grads_.part_size(u);
    const kernels::Ptr whole = grads_.unit(u);
    parallel::Comm& group = group_of(grads_, u);
    const kernels::Ptr mine = whole + static_cast<std::size_t>(group.rank()) * part;
    if (!overlap_reduce_) {
        group.reduce_scatter(whole, mine, part);
        reductions_.push_back(Pending{u, {}, 0});
        finish_reduction(u);
        return;
    }
    reductions_.push_back(
        Pending{u, group.ireduce_scatter(whole, mine, part), io::TraceRecorder::now_us()});
    while (reductions_.size() > kReductionsInFlight) finish_reduction(reductions_.front().unit);
}

void ZeroUnits::finish_reduction(std::size_t u) {
    const auto it = std::find_if(reductions_.begin(), reductions_.end(),
                                 [u](const Pending& p) { return p.unit == u; });
    if (it == reductions_.end()) throw Error("internal: no reduction of unit " + std::to_string(u));
    if (!it->request.done()) {
        it->request.wait();
        end_span(io::SpanKind::reduce_scatter, u, it->request, it->start);
    }
    reductions_.erase(it);
    // shard part += this replica's part of the sum; the unit goes.
    const std::size_t part = grads_.part_size(u);
    const kernels::Ptr shard = grads_.shard_part(u);
    ops_.residual_forward(
        shard, shard, grads_.unit(u) + static_cast<std::size_t>(grads_.shards(u).replica) * part,
        part);
    grads_.release(u);
}

void ZeroUnits::finish_reductions() {
    while (!reductions_.empty()) finish_reduction(reductions_.front().unit);
}

// ---- parameters ------------------------------------------------------------------------------

void ZeroUnits::start_gather(std::size_t u) {
    params_.acquire(u);
    const std::size_t part = params_.part_size(u);
    // This replica's part: in the shard, or read from the file into a staging buffer.
    kernels::Ptr mine;
    if (file_) {
        mine = staging_[u] = ops_.allocate(part, params_.dtype());
        file_->fetched(u, mine);
    } else {
        mine = params_.shard_part(u);
    }
    if (!overlap_gather_) {
        group_of(params_, u).all_gather(mine, params_.unit(u), part);
        free_staging(u);
        return;
    }
    gather_start_[u] = io::TraceRecorder::now_us();
    gathers_[u] = group_of(params_, u).iall_gather(mine, params_.unit(u), part);
}

void ZeroUnits::finish_gather(std::size_t u) {
    if (gathers_[u].done()) return;
    gathers_[u].wait();
    end_span(io::SpanKind::all_gather, u, gathers_[u], gather_start_[u]);
    free_staging(u);
}

void ZeroUnits::free_staging(std::size_t u) {
    if (staging_[u]) ops_.release(staging_[u].data);
    staging_[u] = kernels::Ptr();
}

void ZeroUnits::params_needed(std::size_t begin, std::size_t end) {
    const auto [first, last] = params_.units_of(begin, end);
    for (std::size_t u = first; u < last; ++u)
        if (!params_.resident(u)) start_gather(u);
    for (std::size_t u = first; u < last; ++u) finish_gather(u);
}

void ZeroUnits::params_prefetch(std::size_t begin, std::size_t end) {
    const auto [first, last] = params_.units_of(begin, end);
    if (file_)  // the parts read ahead, under the current unit's compute
        for (std::size_t u = first; u < last; ++u)
            if (!params_.resident(u)) file_->fetch(u);
    if (!overlap_gather_) return;
    for (std::size_t u = first; u < last; ++u)
        if (!params_.resident(u)) start_gather(u);
}

void ZeroUnits::params_done(std::size_t begin, std::size_t end) {
    const auto [first, last] = params_.units_of(begin, end);
    for (std::size_t u = first; u < last; ++u) {
        finish_gather(u);
        if (reshard_after_use_) params_.release(u);
    }
}

void ZeroUnits::release_params() {
    for (std::size_t u = 0; u < params_.units().size(); ++u)
        if (params_.resident(u)) {
            finish_gather(u);
            params_.release(u);
        }
    // A part read ahead for a gather that did not come would be stale after the update.
    if (file_) file_->forget_reads();
}

}  // namespace trident::data_parallel
