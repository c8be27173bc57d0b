// The loads of a mixture of experts' layers, their bias's update and the collapse warning
// (see moe_balance.h).
#include "train/moe_balance.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "optim/update.h"

namespace trident::train {

namespace {

double mean_of(const std::vector<double>& v) {
    return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

double MoeLayerLoad::min() const {
    return *std::min_element(tokens.begin(), tokens.end());
}

double MoeLayerLoad::max() const {
    return *std::max_element(tokens.begin(), tokens.end());
}

double MoeLayerLoad::cv() const {
    const double mean = mean_of(tokens);
    double squares = 0;
    for (double t : tokens) squares += (t - mean) * (t - mean);
    return mean > 0 ? std::sqrt(squares / static_cast<double>(tokens.size())) / mean : 0.0;
}

std::vector<MoeLayerLoad> moe_loads(const model::MoeSettings& moe, int layers,
                                    const std::vector<double>& tokens,
                                    const std::vector<double>& dropped) {
    const std::size_t E = static_cast<std::size_t>(moe.experts);
    std::vector<MoeLayerLoad> loads;
    for (int l = 0; l < layers; ++l) {
        if (!moe.moe_layer(l)) continue;
        const auto first = tokens.begin() + static_cast<std::ptrdiff_t>(l * E);
        loads.push_back({l, std::vector<double>(first, first + static_cast<std::ptrdiff_t>(E)),
                         static_cast<int64_t>(dropped[static_cast<std::size_t>(l)])});
    }
    return loads;
}

std::vector<float> bias_step(const std::vector<double>& tokens, double rate) {
    // The loads are whole numbers: the mean equals one exactly when N·load_e is their sum.
    const double mean = mean_of(tokens);
    std::vector<float> step(tokens.size());
    for (std::size_t e = 0; e < tokens.size(); ++e) {
        const double sign = tokens[e] < mean ? 1.0 : tokens[e] > mean ? -1.0 : 0.0;
        step[e] = static_cast<float>(rate * sign);
    }
    return step;
}

MoeBalance::MoeBalance(const model::MoeSettings& moe, const model::ParamLayout& layout)
    : rate_(moe.bias_update_rate) {
    if (!active()) return;
    const model::ModelSpec& spec = layout.spec();
    for (int l = 0; l < layout.shape().layers; ++l) {
        if (!moe.moe_layer(l)) continue;
        const std::string name = spec.layer_prefix + std::to_string(l) + "." +
                                 spec.layers[static_cast<std::size_t>(l)].mlp_name +
                                 ".gate.e_score_correction_bias";
        if (const model::ParamTensor* t = layout.find(name)) biases_.emplace_back(l, t->offset);
    }
}

void MoeBalance::apply(optim::Updater& optimizer, const std::vector<MoeLayerLoad>& loads) const {
    for (const auto& [layer, offset] : biases_) {
        const auto load = std::find_if(loads.begin(), loads.end(),
                                       [&](const MoeLayerLoad& m) { return m.layer == layer; });
        optimizer.add_to_master(offset, bias_step(load->tokens, rate_));
    }
}

std::vector<std::string> CollapseWatch::observe(int step, const std::vector<MoeLayerLoad>& loads) {
    idle_.resize(loads.size());
    std::vector<std::string> lines;
    for (std::size_t i = 0; i < loads.size(); ++i) {
        idle_[i].resize(loads[i].tokens.size(), 0);
        for (std::size_t e = 0; e < loads[i].tokens.size(); ++e) {
            int& idle = idle_[i][e];
            idle = loads[i].tokens[e] > 0 ? 0 : idle + 1;
            if (idle < kSteps || !said_.emplace(loads[i].layer, e).second) continue;
            lines.push_back("step " + std::to_string(step) + ": layer " +
                            std::to_string(loads[i].layer) + "'s expert " + std::to_string(e) +
                            " received no token for " + std::to_string(kSteps) +
                            " steps in a row (router collapse; said once per expert)");
        }
    }
    return lines;
}

}  // namespace trident::train
