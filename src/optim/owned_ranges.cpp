// The owned ranges of the trainable buffer (see owned_ranges.h).
#include "optim/owned_ranges.h"

#include <algorithm>

namespace trident::optim {

namespace {

bool inside(std::size_t offset, std::pair<std::size_t, std::size_t> range) {
    return offset >= range.first && offset < range.second;
}

}  // namespace

bool is_layer_matrix(const model::ParamLayout& layout, const model::ParamTensor& t) {
    // The vocabulary's tensors (wte, the LM head) wherever a stage holds them: a pipeline's
    // last stage holds the tied wte outside its head's range.
    return t.trains && t.full_shape.size() == 2 && t.split.kind != model::SplitKind::vocabulary &&
           !inside(t.offset, layout.embedding_range()) && !inside(t.offset, layout.head_range());
}

MatrixSplit matrix_split(const model::ParamLayout& layout) {
    MatrixSplit split;
    for (const model::ParamTensor& t : layout.tensors()) {
        if (!t.trains) continue;
        const bool matrix = is_layer_matrix(layout, t);
        ++(matrix ? split.matrices : split.others);
        (matrix ? split.matrix_parameters : split.other_parameters) += t.numel;
    }
    return split;
}

std::vector<OwnedRange> owned_ranges(const model::ParamLayout& layout,
                                     const std::vector<data_parallel::OwnedPart>& owned) {
    std::vector<OwnedRange> ranges;
    for (const auto& t : layout.tensors()) {
        const bool counted = !layout.held_elsewhere(t);
        const bool matrix = is_layer_matrix(layout, t);
        const bool expert = layout.split_expert(t);
        // The parts (in buffer order) from the first that ends after the tensor begins.
        auto first = std::partition_point(owned.begin(), owned.end(), [&](const auto& o) {
            return o.offset + o.count <= t.offset;
        });
        for (auto it = first; it != owned.end() && it->offset < t.offset + t.numel; ++it) {
            const data_parallel::OwnedPart& o = *it;
            // The part of the tensor that this rank owns in this part.
            const std::size_t lo = std::max(t.offset, o.offset);
            const std::size_t hi = std::min(t.offset + t.numel, o.offset + o.count);
            if (lo >= hi) continue;
            const std::size_t state = o.state + (lo - o.offset);
            OwnedRange* last = ranges.empty() ? nullptr : &ranges.back();
            if (last && last->decay == t.decay && last->counted == counted &&
                last->trains == t.trains && last->matrix == matrix && last->expert == expert &&
                last->offset + last->count == lo && last->state + last->count == state)
                last->count += hi - lo;
            else
                ranges.push_back(
                    OwnedRange{lo, hi - lo, state, t.decay, counted, t.trains, matrix, expert});
        }
    }
    std::size_t grouped[2] = {0, 0};  // the others', the matrices'
    for (OwnedRange& r : ranges) {
        r.grouped = grouped[r.matrix];
        grouped[r.matrix] += r.count;
    }
    return ranges;
}

}  // namespace trident::optim
