// Text generation (see generator.h).
#include "train/generator.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/error.h"
#include "kernels/random.h"

namespace trident::train {

namespace {

model::GptOptions whole_model(const model::GptShape& shape) {
    model::GptOptions o;
    o.shape = shape;
    return o;
}

}  // namespace

GenerationModel::GenerationModel(kernels::Ops& ops, const model::GptShape& shape)
    : gpt_(ops, whole_model(shape), model::ModelGroups{solo_.tensor(), solo_.context()}) {}

int32_t sample_token(std::vector<float> logits, const SamplingOptions& opts, uint64_t draw) {
    const auto best = std::max_element(logits.begin(), logits.end());  // first of equal maxima
    if (opts.temperature <= 0) return static_cast<int32_t>(best - logits.begin());
    const std::size_t V = logits.size();
    if (opts.top_k > 0 && static_cast<std::size_t>(opts.top_k) < V) {
        std::vector<float> sorted(logits);
        std::nth_element(sorted.begin(), sorted.begin() + (opts.top_k - 1), sorted.end(),
                         std::greater<float>());
        const float kth = sorted[static_cast<std::size_t>(opts.top_k - 1)];
        for (float& l : logits)
            if (l < kth) l = -INFINITY;
    }
    std::vector<double> p(V);
    double sum = 0;
    for (std::size_t i = 0; i < V; ++i) {
        p[i] = std::exp((static_cast<double>(logits[i]) - *best) / opts.temperature);
        sum += p[i];
    }
    double u = kernels::uniform_open(opts.seed, draw) * sum;
    for (std::size_t i = 0; i < V; ++i) {
        u -= p[i];
        if (u <= 0) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(best - logits.begin());  // rounding left u > 0: the likeliest
}

std::vector<int32_t> generate(model::Gpt& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& opts,
                              const std::function<void(int32_t)>& each) {
    if (prompt.empty()) throw Error("generation needs a prompt of at least one token");
    const std::size_t T = static_cast<std::size_t>(model.shape().max_seq);
    std::vector<int32_t> context(prompt);
    std::vector<int32_t> inputs(static_cast<std::size_t>(model.micro_batch()) * T, 0);
    std::vector<int32_t> generated;
    for (int i = 0; i < opts.tokens; ++i) {
        // The last T tokens of the context; positions after it do not affect it (causal).
        const std::size_t n = std::min(context.size(), T);
        std::copy(context.end() - static_cast<std::ptrdiff_t>(n), context.end(), inputs.begin());
        const int32_t next = sample_token(model.logits_at(inputs.data(), static_cast<int>(n) - 1),
                                          opts, static_cast<uint64_t>(i));
        context.push_back(next);
        generated.push_back(next);
        if (each) each(next);
    }
    return generated;
}

}  // namespace trident::train
