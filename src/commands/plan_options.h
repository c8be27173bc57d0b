// What `trident plan` and its search (plan_search.cpp) share of their options: the device
// memory's size, the hardware the rates describe, the documents' length and the warning about
// adapters.
#pragma once

#include <optional>
#include <string>

#include "commands/commands.h"
#include "config/config.h"
#include "plan/perf_model.h"

namespace trident::commands {

// "80GiB", "80 GiB", "40GB", "1.5TiB" or a number of bytes; throws naming --device-memory.
double parse_size(const std::string& text);

// The hardware the options describe: a preset with any figure replaced, or every figure
// given; none when neither is.
std::optional<plan::Hardware> plan_hardware(const PlanOptions& o);

// --doc-len: at least one token, and only under data.documents: mask; -1 (not given): 0.
int document_length(const config::Config& cfg, int doc_len);

// Under training.lora: what the plan models of it, on stderr.
void warn_lora(const config::Config& cfg);

}  // namespace trident::commands
