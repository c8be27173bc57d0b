// Text and SVG drawings of a simulated pipeline schedule (timeline.h). The SVG is built as a
// string: a few dozen lines of rectangles and text need no library.
#include "pipeline/timeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace trident::pipeline {

namespace {

// Numbers in SVG attributes: one decimal is finer than a pixel needs.
std::string num(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", x);
    return buf;
}

std::string percent(double fraction) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f%%", 100.0 * fraction);
    return buf;
}

struct Rgb {
    int r, g, b;
};

// Chunk 0 in the full colour, later chunks mixed towards white (up to 55%), as PTD-P's
// figure 4 tells chunks apart by shade.
Rgb shade(Rgb base, int chunk, int v) {
    const double t = v > 1 ? 0.55 * chunk / (v - 1) : 0.0;
    auto mix = [t](int c) { return static_cast<int>(std::lround(c + (255 - c) * t)); };
    return {mix(base.r), mix(base.g), mix(base.b)};
}

std::string css(Rgb c) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c.r, c.g, c.b);
    return buf;
}

constexpr Rgb forward_colour{78, 121, 167};  // blue
constexpr Rgb backward_colour{89, 161, 79};  // green: a backward, or its B
constexpr Rgb weight_colour{242, 142, 43};   // orange: the W of a split backward

Rgb base_colour(Op op) {
    return op == Op::forward           ? forward_colour
           : op == Op::backward_weight ? weight_colour
                                       : backward_colour;
}

// Whether the streams split backwards into B and W.
bool split(const Simulation& sim) {
    for (const StageTrace& stage : sim.stages)
        for (const Span& span : stage.spans)
            if (span.op == Op::backward_weight) return true;
    return false;
}

// A step between axis ticks from 1, 2, 5, 10, 20, 50, ... giving at most 20 ticks.
double tick_step(double span) {
    for (double step = 1;; step *= 10)
        for (double k : {1.0, 2.0, 5.0})
            if (span / (k * step) <= 20) return k * step;
}

// Where render_svg puts things, in pixels, and what it writes where.
struct SvgLayout {
    double makespan = 0;  // the simulation's, at least 1e-9
    double unit = 0;      // pixels per time unit
    double left = 80, top = 56, row_height = 32, box_height = 26;
    double chart_width = 0, axis_y = 0, legend_y = 0, width = 0, height = 0;
    bool with_weights = false;        // backwards split into B and W
    std::vector<Rgb> legend_colours;  // of a chunk: forward, backward, or forward, B, W
    double swatches = 0;              // their width in the legend
    std::string title;
    // One label size per kind of box, so that every box of a kind is labelled or none is.
    double forward_font = 0, backward_font = 0, input_font = 0, weight_font = 0;
};

std::string legend_label(const Simulation& sim, bool with_weights, int chunk) {
    const std::string kinds = with_weights ? "forward, B, W" : "forward, backward";
    return sim.v > 1 ? kinds + " of chunk " + std::to_string(chunk) : kinds;
}

// A chunk's legend item: the swatches, a gap, about 7 px a character.
double legend_item_width(const Simulation& sim, const SvgLayout& at, int chunk) {
    return at.swatches + 4 +
           7.0 * static_cast<double>(legend_label(sim, at.with_weights, chunk).size()) + 18;
}

SvgLayout svg_layout(const Simulation& sim) {
    SvgLayout at;
    at.makespan = std::max(sim.makespan, 1e-9);
    at.unit = std::clamp(960.0 / at.makespan, 4.0, 36.0);
    at.chart_width = at.makespan * at.unit;
    at.axis_y = at.top + sim.P * at.row_height + 6;
    at.legend_y = at.axis_y + 40;
    at.with_weights = split(sim);
    at.legend_colours = at.with_weights
                            ? std::vector<Rgb>{forward_colour, backward_colour, weight_colour}
                            : std::vector<Rgb>{forward_colour, backward_colour};
    at.swatches = 16.0 * static_cast<double>(at.legend_colours.size());
    double legend_width = 0;
    for (int c = 0; c < sim.v; ++c) legend_width += legend_item_width(sim, at, c);
    at.title = display_name(sim) + ": P = " + std::to_string(sim.P) +
               ", v = " + std::to_string(sim.v) + ", m = " + std::to_string(sim.m) + ", bubble " +
               percent(sim.bubble_fraction) + " of ideal";
    if (sim.deadlock) at.title += " (DEADLOCK)";
    const double title_width = 9.5 * static_cast<double>(at.title.size());  // 16 px bold
    at.width = at.left + std::max({at.chart_width, legend_width, title_width}) + 30;
    at.height = at.legend_y + 30;
    // The widest microbatch number must fit the box.
    const double digits = static_cast<double>(std::to_string(std::max(sim.m - 1, 0)).size());
    auto label_font = [&](double cost) { return std::min(12.0, 0.9 * cost * at.unit / digits); };
    at.forward_font = label_font(sim.costs.forward);
    at.backward_font = label_font(sim.costs.backward);
    at.input_font = label_font(sim.costs.backward - sim.costs.weight);
    at.weight_font = label_font(sim.costs.weight);
    return at;
}

// One compute instruction's box in row y, labelled with its microbatch where that fits.
std::string svg_box(const Simulation& sim, const SvgLayout& at, const Span& span, double y) {
    const Rgb colour = shade(base_colour(span.op), span.chunk, sim.v);
    const double x = at.left + span.start * at.unit;
    const double w = (span.end - span.start) * at.unit;
    const std::string mb = std::to_string(span.microbatch);
    std::string svg =
        "<rect class=\"" + std::string(to_string(span.op)) + "\" x=\"" + num(x) + "\" y=\"" +
        num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(at.box_height) + "\" fill=\"" +
        css(colour) + "\" stroke=\"white\" stroke-width=\"1\"><title>" + to_string(span.op) +
        " microbatch " + mb + ", chunk " + std::to_string(span.chunk) + "</title></rect>\n";
    const double font = span.op == Op::forward           ? at.forward_font
                        : span.op == Op::backward_input  ? at.input_font
                        : span.op == Op::backward_weight ? at.weight_font
                                                         : at.backward_font;
    if (font >= 6)  // smaller is unreadable
        svg += "<text x=\"" + num(x + w / 2) + "\" y=\"" + num(y + at.box_height / 2 + font / 3) +
               "\" font-size=\"" + num(font) + "\" text-anchor=\"middle\" fill=\"" +
               (colour.r + colour.g + colour.b < 500 ? "white" : "#222") + "\">" + mb + "</text>\n";
    return svg;
}

// Stage s's row: its label, the idle background and a box per compute instruction.
std::string svg_stage(const Simulation& sim, const SvgLayout& at, int s) {
    const double y = at.top + s * at.row_height;
    std::string svg = "<g class=\"stage\" data-stage=\"" + std::to_string(s) + "\">\n";
    svg += "<text x=\"" + num(at.left - 10) + "\" y=\"" + num(y + at.row_height / 2 + 4) +
           "\" font-size=\"13\" text-anchor=\"end\">stage " + std::to_string(s) + "</text>\n";
    svg += "<rect x=\"" + num(at.left) + "\" y=\"" + num(y) + "\" width=\"" + num(at.chart_width) +
           "\" height=\"" + num(at.box_height) + "\" fill=\"#f2f2f2\"/>\n";  // idle
    for (const Span& span : sim.stages[s].spans) svg += svg_box(sim, at, span, y);
    svg += "</g>\n";
    return svg;
}

// The time axis, in the simulator's units.
std::string svg_axis(const SvgLayout& at) {
    std::string svg = "<line x1=\"" + num(at.left) + "\" y1=\"" + num(at.axis_y) + "\" x2=\"" +
                      num(at.left + at.chart_width) + "\" y2=\"" + num(at.axis_y) +
                      "\" stroke=\"#444\"/>\n";
    const double step = tick_step(at.makespan);
    for (double t = 0; t <= at.makespan + 1e-9; t += step) {
        const double x = at.left + t * at.unit;
        svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(at.axis_y) + "\" x2=\"" + num(x) +
               "\" y2=\"" + num(at.axis_y + 5) + "\" stroke=\"#444\"/>\n";
        char label[32];
        std::snprintf(label, sizeof label, "%g", t);
        svg += "<text x=\"" + num(x) + "\" y=\"" + num(at.axis_y + 18) +
               "\" font-size=\"11\" text-anchor=\"middle\">" + label + "</text>\n";
    }
    svg += "<text x=\"" + num(at.left - 10) + "\" y=\"" + num(at.axis_y + 18) +
           "\" font-size=\"11\" text-anchor=\"end\">time</text>\n";
    return svg;
}

// The legend: swatches (forward, backward, or forward, B, W) per chunk.
std::string svg_legend(const Simulation& sim, const SvgLayout& at) {
    std::string svg;
    double x = at.left;
    for (int c = 0; c < sim.v; ++c) {
        for (const Rgb base : at.legend_colours) {
            svg += "<rect x=\"" + num(x) + "\" y=\"" + num(at.legend_y - 11) +
                   "\" width=\"14\" height=\"14\" fill=\"" + css(shade(base, c, sim.v)) + "\"/>\n";
            x += 16;
        }
        svg += "<text x=\"" + num(x + 4) + "\" y=\"" + num(at.legend_y) + "\" font-size=\"12\">" +
               legend_label(sim, at.with_weights, c) + "</text>\n";
        x += legend_item_width(sim, at, c) - at.swatches;
    }
    return svg;
}

}  // namespace

std::string display_name(const Simulation& sim) {
    if (!sim.kind) return "Schedule";
    switch (*sim.kind) {
        case Kind::gpipe:
            return "GPipe";
        case Kind::one_f_one_b:
            return "1F1B";
        case Kind::interleaved:
            return "Interleaved 1F1B";
        case Kind::zb_h1:
            return "ZB-H1";
        case Kind::zb_h2:
            return "ZB-H2";
        case Kind::zb_v:
            return "ZB-V";
    }
    return "Schedule";
}

int text_columns_per_unit(const Costs& costs) {
    for (int k : {1, 2, 4, 5, 10}) {
        bool whole = true;
        for (double c : {costs.forward, costs.backward, costs.latency, costs.weight})
            whole = whole && std::abs(c * k - std::round(c * k)) < 1e-9;
        if (whole) return k;
    }
    return 10;
}

std::string render_text(const Simulation& sim, int columns_per_unit) {
    const int k = columns_per_unit > 0 ? columns_per_unit : text_columns_per_unit(sim.costs);
    auto column = [k](double t) { return static_cast<long>(std::lround(t * k)); };
    const long width = column(sim.makespan);
    const int label_width = static_cast<int>(std::to_string(std::max(sim.P - 1, 0)).size());
    std::string out;
    for (int s = 0; s < sim.P; ++s) {
        std::string row(static_cast<std::size_t>(width), '.');
        for (const Span& span : sim.stages[s].spans) {
            const char letter = span.op == Op::backward_weight
                                    ? static_cast<char>('0' + span.microbatch % 10)
                                    : static_cast<char>((span.op == Op::forward ? 'a' : 'A') +
                                                        span.microbatch % 26);
            for (long c = column(span.start); c < column(span.end) && c < width; ++c)
                row[static_cast<std::size_t>(c)] = letter;
        }
        std::string label = std::to_string(s);
        label.insert(0, static_cast<std::size_t>(label_width) - label.size(), ' ');
        out += "stage " + label + " |" + row + "|\n";
    }
    return out;
}

std::string text_legend() {
    return "a b c ...: forward of microbatch 0 1 2 ... (mod 26); A B C ...: its backward (or its "
           "B); 0 1 2 ...: its W (mod 10); .: idle";
}

std::string render_svg(const Simulation& sim) {
    const SvgLayout at = svg_layout(sim);
    std::string svg;
    svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(at.width) + "\" height=\"" +
           num(at.height) + "\" viewBox=\"0 0 " + num(at.width) + " " + num(at.height) +
           "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
    svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    svg += "<text x=\"" + num(at.left) + "\" y=\"28\" font-size=\"16\" font-weight=\"bold\">" +
           at.title + "</text>\n";
    for (int s = 0; s < sim.P; ++s) svg += svg_stage(sim, at, s);
    svg += svg_axis(at);
    svg += svg_legend(sim, at);
    svg += "</svg>\n";
    return svg;
}

}  // namespace trident::pipeline
