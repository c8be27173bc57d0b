// Drawings of a simulated schedule (simulator.h): a text timeline for the terminal and an SVG
// figure in the style of the GPipe and PTD-P papers (one row per stage, time to the right,
// forward and backward boxes labelled with their microbatch).
#pragma once

#include <string>

#include "pipeline/simulator.h"

namespace trident::pipeline {

// "1F1B", "GPipe", "Interleaved 1F1B", or "Schedule" for streams not made by schedule().
std::string display_name(const Simulation& sim);

// Text columns per time unit that make every cost a whole number of columns: 1 for whole
// costs, else the smallest of 2, 4, 5, 10 that works, else 10 (boxes are then rounded).
int text_columns_per_unit(const Costs& costs);

// One row per stage, one character per column (columns_per_unit <= 0: the one above):
//   stage 0 |ab..AA.BB|
// lower-case a, b, c, ... is the forward of microbatch 0, 1, 2, ... (mod 26), upper-case its
// backward, '.' idle. Each row ends with a newline.
std::string render_text(const Simulation& sim, int columns_per_unit = 0);

// The line that explains render_text's characters.
std::string text_legend();

// A standalone SVG document: a title with the kind, P, v, m and the bubble fraction; per
// stage a row (<g class="stage">) of boxes, forwards blue and backwards green, lighter for
// later chunks, labelled with the microbatch; a time axis and a legend.
std::string render_svg(const Simulation& sim);

}  // namespace trident::pipeline
