// A mixture of experts' loads over a step's global batch (docs/ARCHITECTURE.md, "Mixture of
// experts"): the choices each expert of each MoE layer received, the figures the metrics show
// of them, the warning of an expert that received none for many steps in a row (router
// collapse), and DeepSeek-V3's auxiliary-loss-free balancing (Liu et al., "DeepSeek-V3
// Technical Report", 2024, section 2.1.2): after each applied update, every MoE layer's router
// bias b_e += bias_update_rate · sign(mean(load) − load_e), sign(0) = 0, in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/moe_settings.h"
#include "model/param_layout.h"

namespace trident::optim {
class Updater;  // optim/update.h
}

namespace trident::train {

// One MoE layer's load in a step: the choices (every token's k) of the whole global batch each
// expert received, every microbatch and replica counted (a capacity's dropped ones too: the
// router's demand, which the bias balances), and those a capacity dropped.
struct MoeLayerLoad {
    int layer = 0;               // global index
    std::vector<double> tokens;  // (experts)
    int64_t dropped = 0;         // choices a capacity dropped (0: dropless)

    double min() const;
    double max() const;
    // The coefficient of variation: the population standard deviation over the mean.
    double cv() const;
};

// The MoE layers' loads from the sums over the step (tokens: layers × experts, dropped: layers;
// a dense layer's zeros), in layer order.
std::vector<MoeLayerLoad> moe_loads(const model::MoeSettings& moe, int layers,
                                    const std::vector<double>& tokens,
                                    const std::vector<double>& dropped);

// One layer's bias step: rate · sign(mean(tokens) − tokens_e) for each expert e.
std::vector<float> bias_step(const std::vector<double>& tokens, double rate);

// Moves the router bias of each MoE layer this stage holds by its bias_step, through the
// optimizer's master weights (optim/update.h, Updater::add_to_master): each rank adds to the
// elements it owns, and the data-parallel gather makes every replica's copy the same.
class MoeBalance {
public:
    MoeBalance(const model::MoeSettings& moe, const model::ParamLayout& layout);
    bool active() const { return rate_ > 0; }
    void apply(optim::Updater& optimizer, const std::vector<MoeLayerLoad>& loads) const;

private:
    double rate_ = 0;
    std::vector<std::pair<int, std::size_t>> biases_;  // (global layer, offset in the buffer)
};

// The experts that received no choice for kSteps steps in a row: a line for each, once per run.
class CollapseWatch {
public:
    static constexpr int kSteps = 100;
    // The lines this step's loads give (step: 1-based).
    std::vector<std::string> observe(int step, const std::vector<MoeLayerLoad>& loads);

private:
    std::vector<std::vector<int>> idle_;  // per MoE layer (in order) and expert: steps idle
    std::set<std::pair<int, std::size_t>> said_;
};

}  // namespace trident::train
