// `trident schedule`: simulates one pipeline schedule without a model and shows it: the
// timeline as text, the bubble fraction against the papers' formula, the activations each
// stage holds at most, and an SVG figure. The same streams are what the executor walks.
#include "pipeline/schedule.h"

#include <cstdio>
#include <fstream>

#include "commands/commands.h"
#include "kernels/error.h"
#include "pipeline/simulator.h"
#include "pipeline/timeline.h"
#include "train/metrics.h"

namespace trident::commands {

int schedule(const ScheduleOptions& opts) {
    using namespace pipeline;
    const Kind kind = parse_kind(opts.kind);
    const int v = opts.virtual_stages > 0                           ? opts.virtual_stages
                  : kind == Kind::interleaved || kind == Kind::zb_v ? 2
                                                                    : 1;
    const Costs costs{opts.forward_cost, opts.backward_cost, opts.latency, opts.send_buffers,
                      opts.weight_cost};
    const Simulation sim = simulate(kind, opts.pipeline, v, opts.microbatches, costs);
    require_valid(sim);  // the schedules are proven here; a failure is a bug in schedule.cpp

    const int columns = text_columns_per_unit(costs);
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
        std::ofstream out(opts.svg, std::ios::binary);
        out << render_svg(sim);
        if (!out) throw Error("schedule: cannot write " + opts.svg);
        std::printf("wrote %s\n", opts.svg.c_str());
    }
    return 0;
}

}  // namespace trident::commands
