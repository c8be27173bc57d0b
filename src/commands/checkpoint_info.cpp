// `trident checkpoint info DIR`: a checkpoint's manifest in words, and every file checked.
#include <cstdio>
#include <filesystem>

#include "commands/commands.h"
#include "config/config.h"
#include "io/sha256.h"
#include "io/user_paths.h"
#include "kernels/error.h"
#include "train/base_weights.h"
#include "train/checkpoint.h"
#include "train/checkpoint_manifest.h"
#include "train/metrics.h"

namespace trident::commands {

namespace fs = std::filesystem;

namespace {

// A 4-bit base (training.lora.quantize: nf4, model/nf4_base.h) is not in the checkpoint: each
// load quantizes the base weights again, which gives the same bits.
void print_quantized_base(const std::string& dir) {
    const config::LoraConfig lora =
        config::load((fs::path(dir) / "config.yaml").string()).training.lora;
    if (!lora.quantized()) return;
    std::printf(
        "lora base in 4 bits: %s, blocks of %d, %s; quantized again from the base at "
        "each load (deterministic)\n",
        config::to_string(lora.quantize), lora.quant_block,
        lora.double_quant ? "absmax in 8 bits (double quantization)" : "absmax in fp32");
}

// The low-rank adapters a checkpoint holds, and whether their base weights are still there as
// they were: "" if so (or without adapters), else what is wrong with them.
std::string print_lora(const train::LoraRecord& lora, const std::string& dir) {
    if (lora.rank == 0) return "";
    std::string targets;
    for (const std::string& t : lora.targets) targets += (targets.empty() ? "" : ", ") + t;
    std::printf("lora: rank %d | alpha %g (scale %g) | targets %s\n", lora.rank, lora.alpha,
                lora.alpha / lora.rank, targets.c_str());
    const std::string base = train::resolve_base(lora.base, dir);
    std::string status = "MISSING";
    if (fs::exists(base))
        status = train::base_weights_sha256(base) == lora.base_sha256 ? "ok" : "CHANGED (SHA-256)";
    std::printf("lora base: %s (recorded as %s) | sha256 %.16s…  %s\n", base.c_str(),
                lora.base.c_str(), lora.base_sha256.c_str(), status.c_str());
    print_quantized_base(dir);
    return status == "ok" ? "" : "the adapters' base weights " + base + " are " + status;
}

// A shard whose checksum differs, told apart by its parts' digests (what a resume checks of
// the parts it reads): "" when the only parts damaged are param/ tensors, which no resume or
// export reads (their parameters are the master weights rounded), the damage in `note`; else
// the status to print.
std::string shard_problem(const std::string& dir, const train::ManifestFile& f,
                          const std::string& problem, std::string& note) {
    if (f.pp < 0 || f.header_sha256.empty() || !problem.starts_with("CORRUPT")) return problem;
    const std::vector<std::string> parts = train::damaged_parts(dir, f);
    if (parts.empty()) return problem;
    std::string names;
    bool weights_only = true;
    for (const std::string& part : parts) {
        names += (names.empty() ? "" : ", ") + part;
        weights_only = weights_only && part.starts_with("param/");
    }
    if (!weights_only) return "CORRUPT (" + names + ")";
    note = f.name + ": " + names;
    return "";
}

}  // namespace

int checkpoint_info(const CheckpointInfoOptions& opts) {
    std::string dir = opts.path;
    io::check_input_path(dir, "checkpoint info");
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
        "layout: %s | context %s | schedule %s, virtual stages %d | ZeRO stage %d, buckets of "
        "%lld\n",
        config::layout_text(l.pipeline, l.tensor, l.context, l.data).c_str(),
        l.context_mode.c_str(), l.schedule.c_str(), l.virtual_stages, l.zero_stage,
        static_cast<long long>(l.bucket_size));
    if (l.chunk_layers.size() > 1) {
        std::string cuts;
        for (int n : l.chunk_layers) cuts += (cuts.empty() ? "" : ", ") + std::to_string(n);
        std::printf("pipeline: layers per chunk %s\n", cuts.c_str());
    }
    std::printf("precision: %s | loss scale %g (%d clean steps)\n", m.precision.c_str(),
                m.loss_scale, m.good_steps);
    const std::string base_problem = print_lora(m.lora, dir);
    for (const std::string& run : train::pinned_by(dir))
        std::printf("kept as the base of the adapters of %s (checkpoint.keep passes it over)\n",
                    run.c_str());
    std::printf("files:\n");
    int bad = 0;
    std::vector<std::string> weights_damaged;
    for (const train::ManifestFile& f : m.files) {
        std::string note;
        const std::string problem = shard_problem(dir, f, train::file_problem(dir, f), note);
        const std::string status =
            problem.empty() ? (note.empty() ? "ok" : "DAMAGED param/") : problem;
        if (!note.empty()) weights_damaged.push_back(note);
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
    if (!base_problem.empty()) throw Error(dir + ": " + base_problem);
    if (weights_damaged.empty()) {
        std::printf("all %zu files match their checksums\n", m.files.size());
        return 0;
    }
    // Usable, as a resume finds it: said, with the damage, and the exit code 0 a resume agrees
    // with.
    for (const std::string& w : weights_damaged)
        std::printf(
            "warning: %s: these weights in training precision differ from their SHA-256; no "
            "resume or export reads them (they take the master weights, which match)\n",
            w.c_str());
    std::printf("the checkpoint is usable: every part a resume or an export reads matches\n");
    return 0;
}

}  // namespace trident::commands
