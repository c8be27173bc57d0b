// What `trident plan --search` prints: how many layouts kept the rules and fit, then the fastest
// as a table, each with its memory per GPU, step time, tokens/s per GPU and MFU and the --set
// line that runs it, and why the first beat the second (the part of the step that differs most
// between them); or with --json a JSON object per layout.
#pragma once

#include <string>
#include <vector>

#include "plan/report.h"
#include "plan/search.h"

namespace trident::plan {

struct SearchReport {
    const config::Config& base;
    const SearchOptions& options;
    const SearchResult& result;
    std::vector<Plan> plans;  // of result.best, in its order
    double seconds = 0;       // the search's wall time
};

// The lines before the table: the question and the counts.
std::string search_summary(const SearchReport& report);
std::string render_search_text(const SearchReport& report);
std::string render_search_json(const SearchReport& report);  // a line per layout

// "--set a=1 --set b=2": the layout's keys that differ from the config's.
std::string set_line(const config::Config& base, const Layout& layout);

// Why the first layout beat the second; empty with fewer than two.
std::string why_first(const SearchReport& report);

}  // namespace trident::plan
