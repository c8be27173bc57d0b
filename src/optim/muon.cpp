// Muon's element loops and its whole-matrix step (see muon.h).
#include "optim/muon.h"

#include <algorithm>
#include <cmath>

#include "kernels/host_gemm.h"

namespace trident::optim {

namespace {

// The quintic iteration's coefficients (Jordan et al. 2024).
constexpr float kA = 3.4445f, kB = -4.7750f, kC = 2.0315f;

int as_int(std::size_t n) {
    return static_cast<int>(n);
}

}  // namespace

Muon::Muon(const config::MuonConfig& config, AdamW adamw)
    : config_(config), adamw_(std::move(adamw)) {}

void Muon::update(kernels::Ops& ops, const Segment& s, const Hyper& h) const {
    if (!s.matrix) {
        Segment adam = s;
        adam.state = {s.state[1], s.state[2], nullptr};
        adamw_.update(ops, adam, h);
        return;
    }
    for (std::size_t i = 0; i < s.count; ++i) {
        const float w = s.master[i];
        s.master[i] = w - h.lr * s.weight_decay * w - h.lr * s.direction[i];
    }
    if (s.params.data) ops.convert(s.params, s.master, s.count);
}

void Muon::update_host(const Segment& s, const float* grads, const Hyper& h, std::size_t begin,
                       std::size_t end) const {
    if (!s.matrix) {
        Segment adam = s;
        adam.state = {s.state[1], s.state[2], nullptr};
        adamw_.update_host(adam, grads, h, begin, end);
        return;
    }
    for (std::size_t i = begin; i < end; ++i) {
        const float w = s.master[i];
        s.master[i] = w - h.lr * s.weight_decay * w - h.lr * s.direction[i];
    }
}

void Muon::matrix_input(kernels::Ops& ops, const Segment& s, const Hyper& h, float* out) const {
    ops.copy_to_host(out, s.grads, s.count);
    const auto mu = static_cast<float>(config_.momentum);
    float* buf = s.state[0];
    for (std::size_t i = 0; i < s.count; ++i) {
        const float g = out[i] * h.grad_scale;
        buf[i] = mu * buf[i] + g;
        out[i] = config_.nesterov ? g + mu * buf[i] : buf[i];
    }
}

void newton_schulz(std::vector<float>& x, std::size_t rows, std::size_t cols, int steps) {
    std::vector<float> gram(rows * rows), poly(rows * rows), next(x.size());
    const int r = as_int(rows), c = as_int(cols);
    for (int step = 0; step < steps; ++step) {
        kernels::host_gemm(false, true, r, r, c, 1.0f, x.data(), x.data(), 0.0f, gram.data());
        // poly = b·M + c·M·M
        poly = gram;
        kernels::host_gemm(false, false, r, r, r, kC, gram.data(), gram.data(), kB, poly.data());
        // X ← a·X + poly·X
        next = x;
        kernels::host_gemm(false, false, r, c, r, 1.0f, poly.data(), x.data(), kA, next.data());
        x.swap(next);
    }
}

void Muon::matrix_step(float* m, std::size_t rows, std::size_t cols, std::span<float* const>,
                       const Hyper&) const {
    const std::size_t n = rows * cols;
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += static_cast<double>(m[i]) * m[i];
    const float inverse = 1.0f / (static_cast<float>(std::sqrt(sum)) + 1e-7f);
    // X (short, long): U itself, or Uᵀ when it has more rows than columns.
    const bool transpose = rows > cols;
    const std::size_t short_side = transpose ? cols : rows, long_side = transpose ? rows : cols;
    std::vector<float> x(n);
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j)
            x[transpose ? j * rows + i : i * cols + j] = m[i * cols + j] * inverse;
    newton_schulz(x, short_side, long_side, config_.ns_steps);
    const double a = static_cast<double>(rows), b = static_cast<double>(cols);
    const auto scale = static_cast<float>(config_.scale == config::MuonScale::moonlight
                                              ? 0.2 * std::sqrt(std::max(a, b))
                                              : std::sqrt(std::max(1.0, a / b)));
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j)
            m[i * cols + j] = scale * x[transpose ? j * rows + i : i * cols + j];
}

double Muon::matrix_step_flops(std::size_t rows, std::size_t cols) const {
    // Each iteration: X·Xᵀ (2·a²·b), M·M (2·a³), (b·M + c·M·M)·X (2·a²·b).
    const auto a = static_cast<double>(std::min(rows, cols));
    const auto b = static_cast<double>(std::max(rows, cols));
    return config_.ns_steps * (4 * a * a * b + 2 * a * a * a);
}

}  // namespace trident::optim
