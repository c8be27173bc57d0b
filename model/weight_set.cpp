// Weights on the host: initialisation, loading, and this rank's share of the whole model (see
// weight_set.h).
#include "model/weight_set.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/error.h"
#include "kernels/random.h"

namespace trident::model {

namespace {

// A flat buffer on the host as its layout lays it out (without the padding).
std::vector<float> host_copy(const FlatBuffer& buffer, const ParamLayout& layout) {
    std::vector<float> host = buffer.to_host();
    host.resize(layout.total());
    return host;
}

// Tensor t of the whole model as its part declared it starts (ParamTensor::init).
void init_tensor(const ParamLayout& whole, std::size_t ti, uint64_t seed, float init_std,
                 float* p) {
    const ParamTensor& t = whole.tensors()[ti];
    const GptShape& s = whole.shape();
    if (t.init == Init::zeros || t.init == Init::ones) {
        std::fill_n(p, t.numel, t.init == Init::ones ? 1.0f : 0.0f);
        return;
    }
    if (t.init != Init::normal && t.init != Init::residual)
        throw Error("internal: " + t.name + " is not a model parameter's initialisation");
    const double stddev =
        t.init == Init::residual ? init_std / std::sqrt(2.0 * s.layers) : init_std;
    // Padded vocabulary rows stay zero: they never take part in the loss.
    std::size_t count = t.numel;
    if (t.split.kind == SplitKind::vocabulary) count = static_cast<std::size_t>(s.vocab) * s.hidden;
    const uint64_t tensor_seed = kernels::hash64(seed, ti);
    for (std::size_t i = 0; i < count; ++i)
        p[i] = static_cast<float>(stddev * kernels::normal(tensor_seed, i));
}

}  // namespace

void init_random(WeightSet& weights, uint64_t seed, float init_std) {
    // Tensor by tensor: each of this rank's tensors made whole, as the whole model's
    // initialisation makes it (its own seed, whatever the layout), and its slice kept, so the
    // host holds one whole tensor at a time beside this rank's share, not the whole model.
    const ParamLayout& layout = weights.layout();
    const ParamLayout& whole = weights.whole();
    std::vector<float> local(layout.total(), 0.0f), tensor;
    for (const ParamTensor& t : layout.tensors()) {
        const ParamTensor* w = whole.find(t.name);
        tensor.assign(w->numel, 0.0f);
        init_tensor(whole, static_cast<std::size_t>(w - whole.tensors().data()), seed, init_std,
                    tensor.data());
        for_each_slice_run(t, layout.tensor_rank(),
                           [&](std::size_t at, std::size_t from, std::size_t n) {
                               std::copy_n(tensor.data() + from, n, local.data() + t.offset + at);
                           });
    }
    weights.load(local);
}

std::vector<float> random_whole(const ParamLayout& whole, uint64_t seed, float init_std) {
    std::vector<float> values(whole.total(), 0.0f);
    for (std::size_t ti = 0; ti < whole.tensors().size(); ++ti)
        init_tensor(whole, ti, seed, init_std, values.data() + whole.tensors()[ti].offset);
    return values;
}

WeightSet::WeightSet(const ParamLayout& layout, ParamLayout whole, FlatBuffer& params,
                     FlatBuffer& grads)
    : layout_(&layout), whole_(std::move(whole)), params_(&params), grads_(&grads) {}

void WeightSet::load(const std::vector<float>& local) {
    params_->from_host(local);
}

void WeightSet::load_whole(const std::vector<float>& whole) {
    std::vector<float> local(layout_->total());
    shard_params(whole_, whole.data(), *layout_, local.data());
    load(local);
}

std::vector<float> WeightSet::params_to_host() const {
    return host_copy(*params_, *layout_);
}

std::vector<float> WeightSet::grads_to_host() const {
    return host_copy(*grads_, *layout_);
}

std::vector<float> WeightSet::share_of_whole(const std::vector<float>& local) const {
    return model::share_of_whole(*layout_, local, whole_);
}

}  // namespace trident::model
