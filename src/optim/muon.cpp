// Muon's element loops and its whole-matrix step (see muon.h).
#include "optim/muon.h"

#include <algorithm>
#include <cmath>

namespace trident::optim {

Muon::Muon(const config::MuonConfig& config, AdamW adamw)
    : config_(config), adamw_(std::move(adamw)) {}

void Muon::update(kernels::Ops& ops, const Segment& s, const Hyper& h) const {
    if (!s.matrix) {
        Segment adam = s;
        adam.state = {s.state[1], s.state[2], nullptr};
        adamw_.update(ops, adam, h);
        return;
    }
    // The direction (host memory) up to the backend, a piece at a time, then the step there.
    staged(s.count, s.staging, [&](std::size_t at, std::size_t n) {
        ops.upload(s.staging.data(), s.direction + at, n * sizeof(float));
        ops.muon_update(s.master + at, s.staging.data(), n, h.lr, s.weight_decay,
                        s.params.data ? s.params + at : s.params);
    });
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
    staged(s.count, s.staging, [&](std::size_t at, std::size_t n) {
        ops.muon_momentum(s.staging.data(), s.state[0] + at, s.grads + at, n,
                          static_cast<float>(config_.momentum), config_.nesterov, h.grad_scale);
        ops.download(out + at, s.staging.data(), n * sizeof(float));
    });
}

void Muon::matrix_input_host(const Segment& s, const float* grads, const Hyper& h,
                             float* out) const {
    const auto mu = static_cast<float>(config_.momentum);
    float* buf = s.state[0];
    for (std::size_t i = 0; i < s.count; ++i) {
        const float g = grads[i] * h.grad_scale;
        buf[i] = mu * buf[i] + g;
        out[i] = config_.nesterov ? g + mu * buf[i] : buf[i];
    }
}

void Muon::matrix_step(kernels::Ops& ops, float* m, std::size_t rows, std::size_t cols,
                       std::span<float* const>, const Hyper&, std::span<float> scratch) const {
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
    // X up to the scratch, the iterations there (in the rest of it), and back.
    float* device = scratch.data();
    ops.upload(device, x.data(), n * sizeof(float));
    ops.newton_schulz(
        device, device + n, static_cast<int>(short_side), static_cast<int>(long_side),
        config_.ns_steps,
        config_.ns_dtype == config::MuonNsDtype::bf16 ? kernels::DType::bf16 : kernels::DType::f32);
    ops.download(x.data(), device, n * sizeof(float));
    const double a = static_cast<double>(rows), b = static_cast<double>(cols);
    const auto scale = static_cast<float>(config_.scale == config::MuonScale::moonlight
                                              ? 0.2 * std::sqrt(std::max(a, b))
                                              : std::sqrt(std::max(1.0, a / b)));
    for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j)
            m[i * cols + j] = scale * x[transpose ? j * rows + i : i * cols + j];
}

std::size_t Muon::matrix_scratch(std::size_t rows, std::size_t cols) const {
    const auto a = static_cast<int>(std::min(rows, cols)),
               b = static_cast<int>(std::max(rows, cols));
    return rows * cols + kernels::newton_schulz_scratch(a, b);
}

double Muon::matrix_step_flops(std::size_t rows, std::size_t cols) const {
    // Each iteration: X·Xᵀ (2·a²·b), M·M (2·a³), (b·M + c·M·M)·X (2·a²·b).
    const auto a = static_cast<double>(std::min(rows, cols));
    const auto b = static_cast<double>(std::max(rows, cols));
    return config_.ns_steps * (4 * a * a * b + 2 * a * a * a);
}

}  // namespace trident::optim
