// `trident checkpoint info DIR`: a checkpoint's manifest in words, and every file checked.
#include <cstdio>
#include <filesystem>

#include "commands/commands.h"
#include "kernels/error.h"
#include "train/checkpoint_manifest.h"
#include "train/metrics.h"

namespace trident::commands {

namespace fs = std::filesystem;

int checkpoint_info(const CheckpointInfoOptions& opts) {
    std::string dir = opts.path;
    if (!fs::exists(fs::path(dir) / train::kManifestName)) {
        const auto all = train::list_checkpoints(dir);
        if (all.empty())
            throw Error(dir +
                        ": no checkpoint here (expected manifest.json, or step_* "
                        "directories holding one)");
        dir = all.back();
    }
    const train::Manifest m = train::read_manifest(dir);
    const auto& s = m.shape;
    const auto& l = m.layout;
    std::printf("checkpoint: %s\n", dir.c_str());
    std::printf("step: %d (samples consumed %lld, seed %llu, Adam step %d, skipped steps %d)\n",
                m.step, static_cast<long long>(m.samples_consumed),
                static_cast<unsigned long long>(m.seed), m.adam_step, m.skipped_total);
    std::printf(
        "model: layers %d | hidden %d | heads %d | ffn %d | seq %d | vocab %d (padded %d)\n",
        s.layers, s.hidden, s.heads, s.ffn, s.max_seq, s.vocab, s.padded_vocab);
    std::printf(
        "layout: %d x %d x %d x %d (pipeline x tensor x context x data) | context %s | schedule "
        "%s, virtual stages %d | ZeRO stage %d, buckets of %lld\n",
        l.pipeline, l.tensor, l.context, l.data, l.context_mode.c_str(), l.schedule.c_str(),
        l.virtual_stages, l.zero_stage, static_cast<long long>(l.bucket_size));
    if (l.chunk_layers.size() > 1) {
        std::string cuts;
        for (int n : l.chunk_layers) cuts += (cuts.empty() ? "" : ", ") + std::to_string(n);
        std::printf("pipeline: layers per chunk %s\n", cuts.c_str());
    }
    std::printf("precision: %s | loss scale %g (%d clean steps)\n", m.precision.c_str(),
                m.loss_scale, m.good_steps);
    std::printf("files:\n");
    int bad = 0;
    for (const train::ManifestFile& f : m.files) {
        const std::string problem = train::file_problem(dir, f);
        const std::string status = problem.empty() ? "ok" : problem;
        bad += !problem.empty();
        std::string where = f.pp < 0 ? ""
                                     : "pp " + std::to_string(f.pp) + ", tp " +
                                           std::to_string(f.tp) + ", dp " + std::to_string(f.dp);
        std::printf("  %-28s %-20s %10s  sha256 %.16s…  %s\n", f.name.c_str(), where.c_str(),
                    train::human_bytes(static_cast<double>(f.bytes)).c_str(), f.sha256.c_str(),
                    status.c_str());
    }
    if (bad > 0)
        throw Error(dir + ": " + std::to_string(bad) + " of " + std::to_string(m.files.size()) +
                    " files fail their check (see above)");
    std::printf("all %zu files match their checksums\n", m.files.size());
    return 0;
}

}  // namespace trident::commands
