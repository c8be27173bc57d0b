// Opening a run's data and filling samples from it (see dataset.h).
#include "data/dataset.h"

#include <cstdio>

#include "data/megatron_dataset.h"
#include "data/token_shards.h"
#include "kernels/error.h"
#include "kernels/random.h"

namespace trident::data {

namespace {

std::vector<double> weights_of(std::span<const config::DataSource> sources,
                               const std::string& what) {
    if (sources.empty()) throw Error(what + ": no dataset given");
    std::vector<double> weights;
    for (const config::DataSource& s : sources) weights.push_back(s.weight);
    return weights;
}

std::string human_tokens(std::size_t n) {
    char buf[32];
    if (n >= 1'000'000'000)
        std::snprintf(buf, sizeof buf, "%.2fG", static_cast<double>(n) / 1e9);
    else if (n >= 1'000'000)
        std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
    else if (n >= 10'000)
        std::snprintf(buf, sizeof buf, "%.1fK", static_cast<double>(n) / 1e3);
    else
        std::snprintf(buf, sizeof buf, "%zu", n);
    return buf;
}

}  // namespace

std::unique_ptr<TokenStream> open_stream(const std::string& path, config::DataFormat format,
                                         int vocab_size, const std::string& what) {
    switch (format) {
        case config::DataFormat::llmc:
            return std::make_unique<TokenShards>(path, vocab_size, what);
        case config::DataFormat::megatron:
            return std::make_unique<MegatronDataset>(megatron_prefix(path), vocab_size, what);
        case config::DataFormat::auto_:
            break;
    }
    const LocatedStream located = detect_format(path);
    if (located.format == StreamFormat::megatron)
        return std::make_unique<MegatronDataset>(located.path, vocab_size, what);
    return std::make_unique<TokenShards>(located.path, vocab_size, what);
}

Dataset::Dataset(std::span<const config::DataSource> sources, config::DataFormat format,
                 int vocab_size, int seq_len, bool shuffle, uint64_t seed, const std::string& what)
    : blend_(weights_of(sources, what)), shuffle_(shuffle) {
    streams_.reserve(sources.size());
    samplers_.reserve(sources.size());
    for (std::size_t i = 0; i < sources.size(); ++i) {
        // In a blend, messages say which item: "data.train[2]".
        const std::string name =
            sources.size() == 1 ? what : what + "[" + std::to_string(i + 1) + "]";
        streams_.push_back(open_stream(sources[i].path, format, vocab_size, name));
        keys_.push_back(name);
        samplers_.emplace_back(*streams_.back(), seq_len, shuffle, seed_of(seed, i), name);
    }
}

uint64_t Dataset::seed_of(uint64_t seed, std::size_t dataset) {
    return dataset == 0 ? seed : kernels::hash64(seed, dataset);
}

void Dataset::fill(uint64_t sample, std::span<int32_t> inputs, std::span<int32_t> targets) {
    const BlendPick p = blend_.pick(sample);
    samplers_[p.dataset].fill(p.sample, inputs, targets);
}

std::vector<Dataset::File> Dataset::files() const {
    std::vector<File> all;
    for (std::size_t i = 0; i < streams_.size(); ++i)
        for (std::string& path : streams_[i]->files()) all.push_back({keys_[i], std::move(path)});
    return all;
}

std::size_t Dataset::tokens() const {
    std::size_t total = 0;
    for (const auto& s : streams_) total += s->size();
    return total;
}

std::string Dataset::summary() const {
    auto one = [&](std::size_t i) {
        return streams_[i]->describe() + ": " + human_tokens(streams_[i]->size()) + " tokens, " +
               std::to_string(samplers_[i].windows()) + " samples per epoch";
    };
    std::string out;
    if (streams_.size() == 1) {
        out = one(0);
    } else {
        out = "blend of " + std::to_string(streams_.size());
        for (std::size_t i = 0; i < streams_.size(); ++i) {
            char share[32];
            std::snprintf(share, sizeof share, "%.1f%%", 100.0 * weight(i));
            out += std::string(i == 0 ? ": " : "; ") + share + " " + one(i);
        }
    }
    return out + (shuffle_ ? ", shuffled" : "");
}

Dataset open_train_data(const config::Config& cfg) {
    return Dataset(cfg.data.train, cfg.data.format, cfg.model.vocab_size, cfg.model.seq_len,
                   cfg.data.shuffle, cfg.training.seed, "data.train");
}

std::unique_ptr<Dataset> open_valid_data(const config::Config& cfg) {
    if (cfg.data.valid.empty()) return nullptr;
    return std::make_unique<Dataset>(cfg.data.valid, cfg.data.format, cfg.model.vocab_size,
                                     cfg.model.seq_len, false, cfg.training.seed, "data.valid");
}

}  // namespace trident::data
