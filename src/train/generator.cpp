// Text generation (see generator.h).
#include "train/generator.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/error.h"
#include "kernels/random.h"

namespace trident::train {

GenerationModel::GenerationModel(kernels::Ops& ops, const model::GptShape& shape,
                                 const std::vector<float>& params)
    : decoder_(ops, shape, model::ModelGroups{solo_.tensor(), solo_.context(), solo_.kv_replicas()},
               params) {}

std::size_t kept_on_slide(int seq_len) {
    return static_cast<std::size_t>(std::max(1, seq_len / 2));
}

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

namespace {

// The last `n` tokens of `context` that its newest one sees: under documents (eod ≥ 0) those
// after the last eod before it.
std::vector<int32_t> last(const std::vector<int32_t>& context, std::size_t n, int32_t eod) {
    auto start = context.end() - static_cast<std::ptrdiff_t>(std::min(n, context.size()));
    for (auto it = context.end() - 1; eod >= 0 && it != start; --it)
        if (*(it - 1) == eod) return {it, context.end()};
    return {start, context.end()};
}

}  // namespace

int32_t generation_eod(const config::DataConfig& data) {
    return data.documents == config::DocumentMode::mask ? data.eod_token : -1;
}

std::vector<int32_t> generate(model::Decoder& model, const std::vector<int32_t>& prompt,
                              const SamplingOptions& opts,
                              const std::function<void(int32_t)>& each) {
    if (prompt.empty()) throw Error("generation needs a prompt of at least one token");
    const int T = model.shape().max_seq;
    std::vector<int32_t> context(prompt);
    std::vector<int32_t> generated;
    std::vector<float> logits = model.prefill(last(context, static_cast<std::size_t>(T), opts.eod));
    for (int i = 0; i < opts.tokens; ++i) {
        const int32_t next = sample_token(logits, opts, static_cast<uint64_t>(i));
        const bool starts_document = opts.eod >= 0 && context.back() == opts.eod;
        context.push_back(next);
        generated.push_back(next);
        if (each) each(next);
        if (i + 1 == opts.tokens) break;
        if (starts_document)
            logits = model.prefill({next});
        else if (model.length() < T)
            logits = model.step(next);
        else
            logits = model.prefill(last(context, kept_on_slide(T), opts.eod));
    }
    return generated;
}

}  // namespace trident::train
