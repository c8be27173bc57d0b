// The update of this rank's owned parts, and the state kept on the device (see update.h; the
// state off the device is offload_update.cpp's).
#include "optim/update.h"

#include <algorithm>
#include <string>
#include <thread>

#include "kernels/device_buffer.h"
#include "kernels/error.h"
#include "kernels/threads.h"

namespace trident::optim {

using data_parallel::OwnedPart;

StateGroup UpdateScope::group(std::size_t a) const {
    return a == 0 ? StateGroup::all : optimizer.state_group(a - 1);
}

std::size_t UpdateScope::count(std::size_t a) const {
    return group_count(group(a), ranges, data_parallel.owned_count());
}

std::size_t group_count(StateGroup g, const std::vector<OwnedRange>& ranges, std::size_t owned) {
    if (g == StateGroup::all) return owned;
    std::size_t n = 0;
    for (const OwnedRange& r : ranges)
        if (covers(g, r.matrix)) n += r.count;
    return n;
}

std::size_t owned_state_bytes(const Optimizer& optimizer, const std::vector<OwnedRange>& ranges,
                              std::size_t owned) {
    std::size_t elements = owned;  // the master weights
    for (std::size_t k = 0; k < optimizer.state_names().size(); ++k)
        elements += group_count(optimizer.state_group(k), ranges, owned);
    return elements * sizeof(float);
}

Segment UpdateScope::segment(const OwnedRange& r, float* const* arrays, std::size_t at,
                             kernels::Ptr params) const {
    Segment s;
    s.master = arrays[0] + at;
    for (std::size_t a = 1; a < this->arrays; ++a) {
        const StateGroup g = group(a);
        s.state[a - 1] = !covers(g, r.matrix)                   ? nullptr
                         : g == StateGroup::all || whole_arrays ? arrays[a] + at
                                                                : arrays[a] + r.grouped;
    }
    s.grads = grads.owned(r.offset);
    s.params = params;
    s.count = r.count;
    s.weight_decay = r.decay ? weight_decay : 0.0f;
    s.matrix = r.matrix;
    if (r.matrix && matrices) s.direction = directions.data() + r.state;
    s.staging = scratch;
    return s;
}

void UpdateScope::step_matrices(float* const* arrays, const Hyper& h) {
    for (const OwnedRange& r : ranges)
        if (r.trains && r.matrix)
            optimizer.matrix_input(ops, segment(r, arrays, r.state, nullptr), h,
                                   directions.data() + r.state);
    matrices->step(optimizer, directions.data(), h, scratch);
}

namespace {

// The state of what this rank owns on the device, whole: one buffer per array, in the owned
// parts' order (an array kept for one group: its owned ranges', in order).
class DevicePlacement final : public Placement {
public:
    explicit DevicePlacement(UpdateScope& scope) : scope_(scope) {
        for (std::size_t a = 0; a < scope.arrays; ++a) {
            arrays_.emplace_back(scope.ops, scope.count(a));
            pointers_.push_back(arrays_.back().f32());
        }
    }

    void update(const Hyper& h, bool first) override {
        const auto& owned = scope_.data_parallel.owned();
        if (first)
            for (const OwnedPart& o : owned)
                scope_.ops.convert(arrays_[0].data() + o.state, scope_.params.owned(o.offset),
                                   o.count);
        if (scope_.matrices) scope_.step_matrices(pointers_.data(), h);
        // Each range's update also rounds its master weights into the parameters.
        for (const OwnedRange& r : scope_.ranges)
            if (r.trains)
                scope_.optimizer.update(
                    scope_.ops,
                    scope_.segment(r, pointers_.data(), r.state, scope_.params.owned(r.offset)), h);
    }

    void params_from_master() override {
        for (const OwnedPart& o : scope_.data_parallel.owned())
            scope_.ops.convert(scope_.params.owned(o.offset), arrays_[0].data() + o.state, o.count);
    }

    // The step goes up and is added on the device: no wait for it (an upload returns at once).
    void add_to_master(std::size_t offset, std::span<const float> delta) override {
        kernels::Ops& ops = scope_.ops;
        const auto add = [&](std::size_t at, std::size_t state, std::size_t n) {
            const kernels::DeviceBuffer step(ops, n);
            ops.upload(step.f32(), delta.data() + at, n * sizeof(float));
            const kernels::Ptr master = arrays_[0].data() + state;
            ops.residual_forward(master, master, step.data(), n);
            ops.convert(scope_.params.owned(offset + at), master, n);
        };
        for_owned_in(scope_.data_parallel.owned(), offset, delta.size(), add);
    }

    void read(OptimizerState& s, bool first) const override {
        for (std::size_t a = 0; a < arrays_.size(); ++a)
            pieces(a, [&](std::size_t offset, std::size_t at, std::size_t n) {
                float* to = s.values[a].data() + offset;
                if (a == 0 && first)
                    scope_.ops.copy_to_host(to, scope_.params.owned(offset), n);
                else
                    scope_.ops.copy_to_host(to, arrays_[a].data() + at, n);
            });
    }

    void write(const OptimizerState& s) override {
        for (std::size_t a = 0; a < arrays_.size(); ++a)
            pieces(a, [&](std::size_t offset, std::size_t at, std::size_t n) {
                scope_.ops.copy_from_host(arrays_[a].data() + at, s.values[a].data() + offset, n);
            });
    }

private:
    // Array a's pieces, visit(offset in the buffer, place in the array, count): the owned
    // parts, or the owned ranges of the array's group.
    template <class Visit>
    void pieces(std::size_t a, Visit&& visit) const {
        const StateGroup g = scope_.group(a);
        if (g == StateGroup::all) {
            for (const OwnedPart& o : scope_.data_parallel.owned())
                visit(o.offset, o.state, o.count);
            return;
        }
        for (const OwnedRange& r : scope_.ranges)
            if (covers(g, r.matrix)) visit(r.offset, r.grouped, r.count);
    }

    UpdateScope& scope_;
    std::vector<kernels::DeviceBuffer> arrays_;  // (owned) fp32 each: master, then the state
    std::vector<float*> pointers_;
};

}  // namespace

std::unique_ptr<Placement> device_placement(UpdateScope& scope) {
    return std::make_unique<DevicePlacement>(scope);
}

Updater::Updater(kernels::Ops& ops, const model::ParamLayout& layout,
                 const config::TrainingConfig& cfg, const config::OptimizerConfig& offload,
                 int rank, const data_parallel::DataParallel& data_parallel, parallel::Comm& tensor,
                 model::FlatBuffer& params, model::FlatBuffer& grads)
    : optimizer_(make_optimizer(cfg, offload)),
      scope_{ops,
             data_parallel,
             owned_ranges(layout, data_parallel.owned()),
             params,
             grads,
             *optimizer_,
             static_cast<float>(cfg.weight_decay),
             1 + optimizer_->state_names().size(),
             nullptr,
             {},
             {},
             false},
      size_(grads.size()) {
    if (optimizer_->whole_matrices()) {
        scratch_ = kernels::DeviceBuffer(ops, matrix_scratch(*optimizer_, layout));
        scope_.scratch = {scratch_.f32(), scratch_.size()};
    }
    const std::size_t allocated_before = ops.allocated_bytes();
    if (optimizer_->whole_matrices()) {
        matrices_ =
            std::make_unique<MatrixExchange>(ops, layout, data_parallel, tensor, *optimizer_);
        scope_.matrices = matrices_.get();
        scope_.directions.assign(data_parallel.owned_count(), 0.0f);
    }
    const auto chunk = static_cast<std::size_t>(offload.offload_chunk);
    if (offload.offload == config::Offload::nvme)
        placement_ = file_placement(scope_, *offload.offload_dir, rank, chunk);
    else if (offload.offload == config::Offload::host)
        placement_ = host_placement(scope_, chunk,
                                    kernels::thread_count(cfg.threads, "training.threads").count);
    else
        placement_ = device_placement(scope_);
    state_bytes_ = ops.allocated_bytes() - allocated_before;
}

void Updater::step(double lr, float grad_scale) {
    const bool first = step_ == 0;
    ++step_;
    placement_->update(Hyper{static_cast<float>(lr), step_, grad_scale}, first);
}

void Updater::params_from_master() {
    placement_->params_from_master();
}

void Updater::add_to_master(std::size_t offset, std::span<const float> delta) {
    if (step_ == 0) throw Error("Updater::add_to_master before the first update");
    placement_->add_to_master(offset, delta);
}

void for_owned_in(const std::vector<OwnedPart>& owned, std::size_t offset, std::size_t n,
                  const std::function<void(std::size_t, std::size_t, std::size_t)>& visit) {
    for (const OwnedPart& o : owned) {
        const std::size_t lo = std::max(offset, o.offset);
        const std::size_t hi = std::min(offset + n, o.offset + o.count);
        if (lo < hi) visit(lo - offset, o.state + (lo - o.offset), hi - lo);
    }
}

OptimizerState Updater::empty_state() const {
    OptimizerState s;
    s.step = step_;
    s.names.push_back(kMaster);
    for (const std::string& name : optimizer_->state_names()) s.names.push_back(name);
    s.values.assign(s.names.size(), std::vector<float>(size_, 0.0f));
    return s;
}

OptimizerState Updater::state() const {
    OptimizerState s = empty_state();
    placement_->read(s, step_ == 0);
    if (matrices_) matrices_->read(s);
    return s;
}

void Updater::restore(const OptimizerState& state, bool zero_missing) {
    // The arrays in this optimizer's order, by name.
    OptimizerState ordered = empty_state();
    for (std::size_t a = 0; a < ordered.names.size(); ++a) {
        const auto it = std::find(state.names.begin(), state.names.end(), ordered.names[a]);
        if (it == state.names.end() && zero_missing) continue;
        if (it == state.names.end())
            throw Error("the checkpoint holds no \"" + ordered.names[a] + "\" of this run's " +
                        optimizer_->name() + " (it was written by another optimizer)");
        ordered.values[a] = state.values[static_cast<std::size_t>(it - state.names.begin())];
    }
    placement_->write(ordered);
    if (matrices_) matrices_->write(state, zero_missing);
    step_ = state.step;
}

StateBytes state_bytes(const config::TrainingConfig& t, const config::OptimizerConfig& o) {
    const std::unique_ptr<Optimizer> optimizer = make_optimizer(t, o);
    StateBytes bytes{sizeof(float), sizeof(float)};  // the master weights
    const bool whole = o.offload != config::Offload::none;
    for (std::size_t k = 0; k < optimizer->state_names().size(); ++k) {
        if (whole || covers(optimizer->state_group(k), true)) bytes.matrix += sizeof(float);
        if (whole || covers(optimizer->state_group(k), false)) bytes.other += sizeof(float);
    }
    return bytes;
}

StatePasses state_passes(const Optimizer& optimizer) {
    StatePasses passes;
    if (!optimizer.whole_matrices()) return passes;
    ++passes.read;
    for (std::size_t k = 0; k < optimizer.state_names().size(); ++k)
        if (covers(optimizer.state_group(k), true)) {
            ++passes.written;
            break;
        }
    return passes;
}

StatePasses state_passes(const config::TrainingConfig& t, const config::OptimizerConfig& o) {
    return state_passes(*make_optimizer(t, o));
}

std::size_t matrix_state_bytes(const Optimizer& optimizer, const model::ParamLayout& layout,
                               std::size_t stride, std::size_t expert_stride) {
    const SteppingOrder order = stepping_order(layout, optimizer);
    std::size_t bytes = 0;
    for (std::size_t k = 0; k < order.matrices.size(); ++k) {
        const model::ParamTensor* t = order.matrices[k];
        if (k < order.experts ? k % stride != 0 : (k - order.experts) % expert_stride != 0)
            continue;
        for (const MatrixStateDecl& d :
             optimizer.matrix_states(static_cast<std::size_t>(t->full_shape[0]),
                                     static_cast<std::size_t>(t->full_shape[1])))
            bytes += d.count * sizeof(float);
    }
    return bytes;
}

std::size_t matrix_scratch(const Optimizer& optimizer, const model::ParamLayout& layout) {
    std::size_t floats = 0;
    for (const model::ParamTensor* t : stepping_order(layout, optimizer).matrices)
        floats =
            std::max(floats, optimizer.matrix_scratch(static_cast<std::size_t>(t->full_shape[0]),
                                                      static_cast<std::size_t>(t->full_shape[1])));
    return floats;
}

}  // namespace trident::optim
