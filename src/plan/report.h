// What `trident plan` prints: the memory of every rank (grouped by pipeline stage, whose ranks
// hold the same figures), the FLOPs and communication of a step, and with hardware figures
// the predicted step time and where it goes; as text for people or as one JSON object.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/json_line.h"
#include "plan/communication.h"
#include "plan/memory_model.h"
#include "plan/perf_model.h"

namespace trident::plan {

struct Plan {
    PlanInputs inputs;
    std::vector<StageMemory> memory;
    std::vector<StageTraffic> traffic;
    std::optional<Hardware> hardware;
    std::optional<StepTime> time;
    std::optional<double> device_memory;  // bytes per GPU, to check each rank against
};

// Computes every part of the plan for `inputs` (the time only with hardware).
Plan make_plan(const PlanInputs& inputs, const std::optional<Hardware>& hardware,
               const std::optional<double>& device_memory);

std::string render_text(const Plan& plan);
std::string render_json(const Plan& plan);

// printf into a string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Parts of the JSON: the layout's keys, and the step time with the hardware figures it
// assumed (plan.time must be set).
io::JsonLine layout_json(const PlanInputs& in);
io::JsonLine step_time_json(const Plan& plan);

}  // namespace trident::plan
