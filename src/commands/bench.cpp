// `trident bench`: times training steps of the configured model on random tokens (no data
// file needed) and prints, last, one JSON line with tokens_per_s, tflops and mfu, and the
// most memory any rank held. With logging.trace it records the timed steps' Chrome trace.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "commands/commands.h"
#include "commands/session.h"
#include "io/json_line.h"
#include "kernels/error.h"
#include "kernels/random.h"
#include "parallel/grid.h"
#include "parallel/world.h"
#include "train/trainer.h"

namespace trident::commands {

namespace {

void run(const BenchOptions& opts, const config::Config& cfg, const Device& device,
         parallel::Grid& grid, parallel::World& world) {
    const bool leader = grid.rank() == 0;
    const auto watchdog = start_watchdog(cfg, grid);
    auto ops = make_backend(cfg, device, grid, leader);
    const Peak peak = peak_flops(cfg, device, *ops, world.comm());
    if (leader) {
        print_warnings(cfg);
        print_summary(cfg, *ops, peak);
    }

    train::Trainer trainer(cfg, *ops, grid);
    initialise_weights(cfg, trainer.model());
    const uint64_t vocab = static_cast<uint64_t>(cfg.model.vocab_size);
    const uint64_t T = static_cast<uint64_t>(cfg.model.seq_len);
    const uint64_t seed = cfg.training.seed;
    const train::SampleFn random_tokens = [&](uint64_t k, std::span<int32_t> in,
                                              std::span<int32_t> tgt) {
        for (uint64_t i = 0; i < T; ++i) {
            in[i] = static_cast<int32_t>(kernels::hash64(seed, k * (T + 1) + i) % vocab);
            tgt[i] = static_cast<int32_t>(kernels::hash64(seed, k * (T + 1) + i + 1) % vocab);
        }
    };

    std::vector<double> seconds;
    int64_t peak_bytes = 0;
    for (int s = 0; s < opts.warmup + opts.steps; ++s) {
        const bool timed = s >= opts.warmup;
        trainer.trace().set_recording(timed && cfg.logging.trace.has_value());
        const train::StepResult r = trainer.step(s, random_tokens);
        trainer.trace().set_recording(false);
        peak_bytes = std::max(peak_bytes, static_cast<int64_t>(r.memory.peak));
        if (timed) seconds.push_back(r.seconds);
        if (leader)
            std::printf("%s step %d | loss %.4f | %.1f ms | %.0f tok/s\n",
                        timed ? "bench" : "warm-up", timed ? s - opts.warmup + 1 : s + 1, r.loss,
                        1e3 * r.seconds,
                        static_cast<double>(cfg.derived.tokens_per_step) / r.seconds);
    }
    world.comm().all_reduce(&peak_bytes, 1, parallel::ReduceOp::max);
    if (cfg.logging.trace) {
        trainer.write_trace(*cfg.logging.trace);  // collective
        if (leader) std::printf("trace: %s\n", cfg.logging.trace->c_str());
    }
    // The median step: robust to a stray slow step on a shared machine.
    std::sort(seconds.begin(), seconds.end());
    const double step_s = seconds[seconds.size() / 2];
    const double flops =
        cfg.derived.flops_per_step / step_s / cfg.derived.world_size;  // per process
    io::JsonLine line;
    line.add("tokens_per_s", static_cast<double>(cfg.derived.tokens_per_step) / step_s)
        .add("tflops", flops / 1e12)
        .add("mfu", flops / peak.flops)
        .add("step_ms", 1e3 * step_s)
        .add("peak_tflops", peak.flops / 1e12)
        .add("peak_reliable", flops <= peak.flops)
        .add("steps", opts.steps)
        .add("backend", ops->name())
        .add("threads", cfg.training.threads)
        .add("parameters", static_cast<int64_t>(cfg.derived.parameters))
        .add("processes", cfg.derived.world_size)
        .add("peak_memory_bytes", peak_bytes);
    if (leader && flops > peak.flops)
        std::printf(
            "note: MFU %.1f%% is above 100%%: the peak measured at start-up is unreliable (a "
            "busy machine); set hardware.peak_flops to this machine's peak FLOP/s per process\n",
            100.0 * flops / peak.flops);
    if (leader) std::printf("%s\n", line.str().c_str());
}

}  // namespace

int bench(const BenchOptions& opts, parallel::World& world) {
    if (opts.steps < 1) throw Error("--steps must be at least 1");
    if (opts.warmup < 0) throw Error("--warmup must not be negative");
    config::Config cfg;
    std::unique_ptr<parallel::Grid> grid;
    Device device;
    return run_on_every_rank(
        world,
        [&] {
            cfg = config::load(opts.config, opts.overrides, config::Purpose::bench);
            grid = std::make_unique<parallel::Grid>(world, grid_shape(cfg));
            device = choose_device(cfg, world, world.rank() == 0);
            if (!device.gpu) check_fits_memory(cfg, world.local_size());
        },
        [&] { run(opts, cfg, device, *grid, world); });
}

}  // namespace trident::commands
