// `trident schedule`: simulates one pipeline schedule without a model and shows it: the
// timeline as text, the bubble fraction against the papers' formula, the activations each
// stage holds at most, and an SVG figure. The same streams are what the executor walks.
#include "pipeline/schedule.h"

#include <cmath>
#include <cstdio>

#include "commands/commands.h"
#include "io/output_file.h"
#include "io/user_paths.h"
#include "kernels/error.h"
#include "pipeline/simulator.h"
#include "pipeline/timeline.h"
#include "train/metrics.h"

namespace trident::commands {

namespace {

// What this command draws at most: stages, chunk passes of a step (P × v × m: their
// simulation takes a few seconds at this count) and characters of the text timeline. Past
// them a simulation grew without bound (std::bad_alloc at P = 65536, m = 10^8) or ran for
// minutes without a word.
constexpr int kMostStages = 1024;
constexpr double kMostPasses = 65536;
constexpr double kMostTimelineCharacters = 1 << 26;

// Each size and cost in its range, before anything is simulated.
void check_sizes(const ScheduleOptions& opts, int v) {
    const auto in_range = [](const char* option, int value, int most) {
        if (value < 1 || value > most)
            throw Error(std::string(option) + " must be in [1, " + std::to_string(most) +
                        "], got " + std::to_string(value));
    };
    in_range("--pipeline", opts.pipeline, kMostStages);
    in_range("--microbatches", opts.microbatches, static_cast<int>(kMostPasses));
    in_range("--virtual", v, static_cast<int>(kMostPasses));
    const double passes = static_cast<double>(opts.pipeline) * v * opts.microbatches;
    if (passes > kMostPasses)
        throw Error("--pipeline x --virtual x --microbatches: " + std::to_string(opts.pipeline) +
                    " x " + std::to_string(v) + " x " + std::to_string(opts.microbatches) +
                    " chunk passes, more than the " + std::to_string(int(kMostPasses)) +
                    " this command draws: simulate fewer microbatches (the bubble is (P-1)/m)");
    for (const auto& [option, cost] : {std::pair{"--forward-cost", opts.forward_cost},
                                       {"--backward-cost", opts.backward_cost},
                                       {"--weight-cost", opts.weight_cost},
                                       {"--latency", opts.latency}})
        if (!std::isfinite(cost) || cost < 0)
            throw Error(std::string(option) + " must be a finite number >= 0, got " +
                        std::to_string(cost));
}

// The text timeline's size, refused before it is drawn when costs far apart (a latency of
// 10^9 forwards) would make it gigabytes wide.
void check_timeline(const pipeline::Simulation& sim, int columns) {
    const double characters = sim.P * (sim.makespan * columns + 16);
    if (characters > kMostTimelineCharacters) {
        char text[256];
        std::snprintf(text, sizeof text,
                      "the timeline would take %.3g characters (time %g at %d column(s) per "
                      "unit, %d stages), more than %.3g: give costs of a similar size",
                      characters, sim.makespan, columns, sim.P, kMostTimelineCharacters);
        throw Error(text);
    }
}

}  // namespace

int schedule(const ScheduleOptions& opts) {
    using namespace pipeline;
    const Kind kind = parse_kind(opts.kind);
    const int v = opts.virtual_stages > 0                           ? opts.virtual_stages
                  : kind == Kind::interleaved || kind == Kind::zb_v ? 2
                                                                    : 1;
    check_sizes(opts, v);
    if (!opts.svg.empty()) io::check_output_file(opts.svg, "--svg");
    const Costs costs{opts.forward_cost, opts.backward_cost, opts.latency, opts.send_buffers,
                      opts.weight_cost};
    const Simulation sim = simulate(kind, opts.pipeline, v, opts.microbatches, costs);
    require_valid(sim);  // the schedules are proven here; a failure is a bug in schedule.cpp

    const int columns = text_columns_per_unit(costs);
    check_timeline(sim, columns);
    std::printf("%s schedule: P = %s, v = %s per stage, m = %s\n", display_name(sim).c_str(),
                train::counted(sim.P, "stage").c_str(), train::counted(v, "chunk").c_str(),
                train::counted(sim.m, "microbatch").c_str());
    std::printf("costs per chunk: forward %g, backward %g", costs.forward, costs.backward);
    if (splits_backward(kind))
        std::printf(" (B %g, W %g)", costs.backward - costs.weight, costs.weight);
    std::printf(", latency %g; %s per time unit\n\n", costs.latency,
                train::counted(columns, "column").c_str());
    std::printf("%s%s\n\n", render_text(sim, columns).c_str(), text_legend().c_str());

    const char* formula = kind == Kind::interleaved ? "(p-1)/(v*m)"
                          : kind == Kind::zb_v      ? "(p-1)/(6m), with F = B = W"
                          : splits_backward(kind)   ? "(p-1)/(3m), with F = B = W"
                                                    : "(p-1)/m";
    std::printf("time %g, ideal %g per stage\n", sim.makespan, sim.ideal);
    std::printf("bubble fraction: %.6f measured, %.6f formula %s\n", sim.bubble_fraction,
                bubble_formula(kind, sim.P, v, sim.m), formula);
    std::printf("peak in flight per stage (chunk activations held / distinct microbatches):\n");
    for (int s = 0; s < sim.P; ++s)
        std::printf("  stage %d: %d / %d\n", s, sim.stages[s].peak_in_flight,
                    sim.stages[s].peak_in_flight_microbatches);
    if (costs.send_buffers > 0) {
        std::printf("outgoing messages held at most per stage (of %s):",
                    train::counted(costs.send_buffers, "buffer").c_str());
        for (const StageTrace& stage : sim.stages) std::printf(" %d", stage.peak_send_buffers);
        std::printf("\n");
    }

    if (!opts.svg.empty()) {
        io::write_file_atomically(opts.svg, render_svg(sim));
        std::printf("wrote %s\n", opts.svg.c_str());
    }
    return 0;
}

}  // namespace trident::commands
