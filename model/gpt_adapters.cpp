// The low-rank adapters of the GPT model's linears: their forward, backward and gradient
// reduction (see model/gpt.h, "Low-rank adapters").
#include <cstddef>

#include "model/gpt.h"

namespace trident::model {

using kernels::ConstPtr;
using kernels::Ptr;

namespace {

std::size_t index(AdapterTarget t) {
    return static_cast<std::size_t>(t);
}

// Whether the linear is row-parallel (split by its input's columns) rather than column-parallel.
bool row_parallel(AdapterTarget t) {
    return t == AdapterTarget::attn_proj || t == AdapterTarget::fc_proj;
}

}  // namespace

std::pair<int, int> Gpt::adapter_widths(AdapterTarget t) const {
    const int C = layout_.shape().hidden, Cm = layout_.hidden_local(), Fm = layout_.ffn_local();
    switch (t) {
        case AdapterTarget::qkv:
            return {C, 3 * Cm};
        case AdapterTarget::attn_proj:
            return {Cm, C};
        case AdapterTarget::fc:
            return {C, Fm};
        case AdapterTarget::fc_proj:
            break;
    }
    return {Fm, C};
}

void Gpt::for_each_input_run(
    AdapterTarget t, const std::function<void(std::size_t, std::size_t, std::size_t)>& fn) const {
    const std::size_t in = static_cast<std::size_t>(adapter_widths(t).first);
    if (!row_parallel(t)) {  // whole rows: a run of rows is one run
        for (const RowRun& run : all_runs_) fn(run.local * in, run.whole * in, run.rows * in);
        return;
    }
    // This rank's columns of each row of the whole input (in·M wide).
    const std::size_t whole_in = in * static_cast<std::size_t>(tensor_.size());
    const std::size_t column = in * static_cast<std::size_t>(tensor_.rank());
    for (const RowRun& run : all_runs_)
        for (std::size_t r = 0; r < run.rows; ++r)
            fn((run.local + r) * in, (run.whole + r) * whole_in + column, in);
}

ConstPtr Gpt::adapter_input(AdapterDropout d, AdapterTarget t, ConstPtr x) {
    if (d.drop == 0) return x;
    const Ptr out = adapter_x_.data();
    for_each_input_run(t, [&](std::size_t local, std::size_t whole, std::size_t count) {
        ops_.dropout_forward(out + local, x + local, count, d.drop, d.seed, whole);
    });
    return out;
}

void Gpt::adapter_down(AdapterDropout d, int l, AdapterTarget t, ConstPtr x, Ptr h) {
    const int in = adapter_widths(t).first, r = adapters_.shape.rank;
    const ConstPtr A = adapter_params_.at(adapter_layout_.adapters(l).a[index(t)]);
    ops_.matmul_forward(h, adapter_input(d, t, x), A, nullptr, rows_, in, r);
    ops_.scale(h, static_cast<std::size_t>(rows_) * r, adapters_.scale);
}

void Gpt::adapter_up(int l, AdapterTarget t, ConstPtr h, Ptr y) {
    const int out = adapter_widths(t).second, r = adapters_.shape.rank;
    const ConstPtr B = adapter_params_.at(adapter_layout_.adapters(l).b[index(t)]);
    ops_.matmul_forward(adapter_y_.data(), h, B, nullptr, rows_, r, out);
    ops_.residual_forward(y, y, adapter_y_.data(), static_cast<std::size_t>(rows_) * out);
}

void Gpt::adapter_backward(AdapterDropout d, int l, AdapterTarget t, ConstPtr x, ConstPtr dy,
                           Ptr dx, ConstPtr h, Part part) {
    const auto [in, out] = adapter_widths(t);
    const int N = rows_, r = adapters_.shape.rank;
    const std::size_t Nr = static_cast<std::size_t>(N) * r;
    const LayerAdapters& offsets = adapter_layout_.adapters(l);
    const ConstPtr A = adapter_params_.at(offsets.a[index(t)]);
    const ConstPtr B = adapter_params_.at(offsets.b[index(t)]);
    const bool weights = part != Part::input, inputs = part != Part::weight;
    // g = s·dy·B, the gradient of drop(x)·A^T (N, r); dB += dy^T·h.
    const Ptr g = adapter_g_.data();
    ops_.zero(g, Nr);
    ops_.matmul_backward(g, weights ? adapter_grads_.at(offsets.b[index(t)]) : Ptr(), nullptr, dy,
                         h, B, N, r, out);
    ops_.scale(g, Nr, adapters_.scale);
    // dA += g^T·drop(x).
    if (weights)
        ops_.matmul_backward(nullptr, adapter_grads_.at(offsets.a[index(t)]), nullptr, g,
                             adapter_input(d, t, x), A, N, in, r);
    if (!inputs) return;
    // dx += g·A, through the dropout's mask.
    if (d.drop == 0) {
        ops_.matmul_backward(dx, nullptr, nullptr, g, x, A, N, in, r);
        return;
    }
    const Ptr dropped = adapter_x_.data();
    ops_.zero(dropped, static_cast<std::size_t>(N) * in);
    ops_.matmul_backward(dropped, nullptr, nullptr, g, x, A, N, in, r);
    for_each_input_run(t, [&](std::size_t local, std::size_t whole, std::size_t count) {
        ops_.dropout_backward(dx + local, dropped + local, count, d.drop, d.seed, whole);
    });
}

void Gpt::adapter_gradients_final(int l) {
    const LayerAdapters& offsets = adapter_layout_.adapters(l);
    for (int i = 0; i < kAdapterTargets; ++i) {
        const AdapterTarget t = static_cast<AdapterTarget>(i);
        if (!adapters_.shape.has(t) || tensor_.size() == 1) continue;
        // The replicated factor: each tensor rank added its part of the sum.
        const auto [in, out] = adapter_widths(t);
        const std::size_t r = static_cast<std::size_t>(adapters_.shape.rank);
        if (row_parallel(t))
            tensor_.all_reduce(adapter_grads_.at(offsets.b[index(t)]),
                               static_cast<std::size_t>(out) * r);
        else
            tensor_.all_reduce(adapter_grads_.at(offsets.a[index(t)]),
                               static_cast<std::size_t>(in) * r);
    }
    const auto [begin, end] = adapter_layout_.layer_range(l);
    if (hooks_.grads_final) hooks_.grads_final(begin, end);
}

}  // namespace trident::model
