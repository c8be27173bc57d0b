// `trident plan --search`: the fastest layouts of a config on N GPUs that fit in their memory
// (docs/FEATURES.md, "Searching for a layout"). It enumerates every layout that keeps the
// rules (search_space.h), computes every one's memory as the plan counts it (search_memory.h)
// and drops those over the device's, then ranks the rest by the planner's predicted step time
// (perf_model.h), fastest first.
//
// Only the best need their step time modelled: layouts go by a lower bound on it, the compute
// of the slowest stage's microbatches plus, for the schedules whose bubble is PTD-P's, the
// bubble of that compute (every other part of the step is at least 0, and the slowest stage
// by the model's measure computes at least as long as any). A group of layouts is modelled
// once its bound is below the slowest of the best found so far; when it is not, no later one
// can be faster, and the search stops.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/perf_model.h"
#include "plan/search_space.h"

namespace trident::plan {

struct SearchOptions {
    SearchSpace space;
    Hardware hardware;
    double device_memory = 0;  // bytes per GPU
    int top = 10;              // layouts to return; 0: every one that fits
    // Under data.documents: mask, the documents' mean length (--doc-len; PlanInputs::doc_len):
    // every layout's attention computes that share of its scores. 0: whole windows.
    int doc_len = 0;
};

// One layout the search ranked.
struct Ranked {
    Layout layout;
    double memory = 0;  // the largest stage's total, bytes
    StepTime time;
};

struct SearchResult {
    int64_t considered = 0;    // layouts that keep every rule
    int64_t fit = 0;           // of them, those that fit in the device memory
    int64_t modelled = 0;      // of those, whose step time was predicted
    std::vector<Ranked> best;  // fastest first
    Ranked smallest;           // the least memory of any layout considered (its time unset)
    Rejections rejected;       // candidates each rule ruled out first
};

SearchResult search(const config::Config& base, const SearchOptions& options);

}  // namespace trident::plan
