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
    const double makespan = std::max(sim.makespan, 1e-9);
    const double unit = std::clamp(960.0 / makespan, 4.0, 36.0);  // pixels per time unit
    const double left = 80, top = 56, row_height = 32, box_height = 26;
    const double chart_width = makespan * unit;
    const double axis_y = top + sim.P * row_height + 6;
    const double legend_y = axis_y + 40;
    const bool with_weights = split(sim);
    const std::vector<Rgb> legend_colours =
        with_weights ? std::vector<Rgb>{forward_colour, backward_colour, weight_colour}
                     : std::vector<Rgb>{forward_colour, backward_colour};
    const double swatches = 16.0 * static_cast<double>(legend_colours.size());
    auto legend_label = [&](int chunk) {
        const std::string kinds = with_weights ? "forward, B, W" : "forward, backward";
        return sim.v > 1 ? kinds + " of chunk " + std::to_string(chunk) : kinds;
    };
    auto legend_item_width = [&](int chunk) {  // the swatches, a gap, about 7 px a character
        return swatches + 4 + 7.0 * static_cast<double>(legend_label(chunk).size()) + 18;
    };
    double legend_width = 0;
    for (int c = 0; c < sim.v; ++c) legend_width += legend_item_width(c);
    std::string title = display_name(sim) + ": P = " + std::to_string(sim.P) +
                        ", v = " + std::to_string(sim.v) + ", m = " + std::to_string(sim.m) +
                        ", bubble " + percent(sim.bubble_fraction) + " of ideal";
    if (sim.deadlock) title += " (DEADLOCK)";
    const double title_width = 9.5 * static_cast<double>(title.size());  // 16 px bold
    const double width = left + std::max({chart_width, legend_width, title_width}) + 30;
    const double height = legend_y + 30;

    // One label size per kind of box, so that every box of a kind is labelled or none is:
    // the widest microbatch number must fit the box.
    const double digits = static_cast<double>(std::to_string(std::max(sim.m - 1, 0)).size());
    auto label_font = [&](double cost) { return std::min(12.0, 0.9 * cost * unit / digits); };
    const double forward_font = label_font(sim.costs.forward);
    const double backward_font = label_font(sim.costs.backward);
    const double input_font = label_font(sim.costs.backward - sim.costs.weight);
    const double weight_font = label_font(sim.costs.weight);

    std::string svg;
    svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" +
           num(height) + "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
           "\" font-family=\"Helvetica, Arial, sans-serif\">\n";
    svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";

    svg += "<text x=\"" + num(left) + "\" y=\"28\" font-size=\"16\" font-weight=\"bold\">" + title +
           "</text>\n";

    for (int s = 0; s < sim.P; ++s) {
        const double y = top + s * row_height;
        svg += "<g class=\"stage\" data-stage=\"" + std::to_string(s) + "\">\n";
        svg += "<text x=\"" + num(left - 10) + "\" y=\"" + num(y + row_height / 2 + 4) +
               "\" font-size=\"13\" text-anchor=\"end\">stage " + std::to_string(s) + "</text>\n";
        svg += "<rect x=\"" + num(left) + "\" y=\"" + num(y) + "\" width=\"" + num(chart_width) +
               "\" height=\"" + num(box_height) + "\" fill=\"#f2f2f2\"/>\n";  // idle
        for (const Span& span : sim.stages[s].spans) {
            const Rgb colour = shade(base_colour(span.op), span.chunk, sim.v);
            const double x = left + span.start * unit;
            const double w = (span.end - span.start) * unit;
            const std::string mb = std::to_string(span.microbatch);
            svg += "<rect class=\"" + std::string(to_string(span.op)) + "\" x=\"" + num(x) +
                   "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(box_height) +
                   "\" fill=\"" + css(colour) + "\" stroke=\"white\" stroke-width=\"1\"><title>" +
                   to_string(span.op) + " microbatch " + mb + ", chunk " +
                   std::to_string(span.chunk) + "</title></rect>\n";
            const double font = span.op == Op::forward           ? forward_font
                                : span.op == Op::backward_input  ? input_font
                                : span.op == Op::backward_weight ? weight_font
                                                                 : backward_font;
            if (font >= 6)  // smaller is unreadable
                svg += "<text x=\"" + num(x + w / 2) + "\" y=\"" +
                       num(y + box_height / 2 + font / 3) + "\" font-size=\"" + num(font) +
                       "\" text-anchor=\"middle\" fill=\"" +
                       (colour.r + colour.g + colour.b < 500 ? "white" : "#222") + "\">" + mb +
                       "</text>\n";
        }
        svg += "</g>\n";
    }

    // The time axis, in the simulator's units.
    svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(axis_y) + "\" x2=\"" +
           num(left + chart_width) + "\" y2=\"" + num(axis_y) + "\" stroke=\"#444\"/>\n";
    const double step = tick_step(makespan);
    for (double t = 0; t <= makespan + 1e-9; t += step) {
        const double x = left + t * unit;
        svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(axis_y) + "\" x2=\"" + num(x) +
               "\" y2=\"" + num(axis_y + 5) + "\" stroke=\"#444\"/>\n";
        char label[32];
        std::snprintf(label, sizeof label, "%g", t);
        svg += "<text x=\"" + num(x) + "\" y=\"" + num(axis_y + 18) +
               "\" font-size=\"11\" text-anchor=\"middle\">" + label + "</text>\n";
    }
    svg += "<text x=\"" + num(left - 10) + "\" y=\"" + num(axis_y + 18) +
           "\" font-size=\"11\" text-anchor=\"end\">time</text>\n";

    // The legend: swatches (forward, backward, or forward, B, W) per chunk.
    double x = left;
    for (int c = 0; c < sim.v; ++c) {
        for (const Rgb base : legend_colours) {
            svg += "<rect x=\"" + num(x) + "\" y=\"" + num(legend_y - 11) +
                   "\" width=\"14\" height=\"14\" fill=\"" + css(shade(base, c, sim.v)) + "\"/>\n";
            x += 16;
        }
        svg += "<text x=\"" + num(x + 4) + "\" y=\"" + num(legend_y) + "\" font-size=\"12\">" +
               legend_label(c) + "</text>\n";
        x += legend_item_width(c) - swatches;
    }
    svg += "</svg>\n";
    return svg;
}

}  // namespace trident::pipeline
