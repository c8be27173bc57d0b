// GaLore's element loops and its whole-matrix step (see galore.h).
#include "optim/galore.h"

#include <algorithm>
#include <cmath>

#include "kernels/host_gemm.h"
#include "kernels/host_svd.h"

namespace trident::optim {

namespace {

int as_int(std::size_t n) {
    return static_cast<int>(n);
}

// The projector of G (rows, cols) into `p`: the first r rows of Vᵀ (r, cols) when rows ≥
// cols, else the first r columns of U (rows, r); signs fixed (kernels/host_svd.h).
void new_projector(const float* g, std::size_t rows, std::size_t cols, std::size_t r, float* p) {
    std::vector<float> a(g, g + rows * cols);
    kernels::Svd svd = kernels::host_svd(a, as_int(rows), as_int(cols));
    const std::size_t k = std::min(rows, cols);
    if (rows >= cols) {
        kernels::fix_row_signs(svd.vt, as_int(k), as_int(cols));
        std::copy(svd.vt.begin(), svd.vt.begin() + static_cast<std::ptrdiff_t>(r * cols), p);
        return;
    }
    kernels::fix_column_signs(svd.u, as_int(rows), as_int(k));
    for (std::size_t i = 0; i < rows; ++i)
        std::copy(svd.u.begin() + static_cast<std::ptrdiff_t>(i * k),
                  svd.u.begin() + static_cast<std::ptrdiff_t>(i * k + r), p + i * r);
}

}  // namespace

Galore::Galore(const config::GaloreConfig& config, AdamW adamw, float beta1, float beta2, float eps)
    : config_(config), adamw_(std::move(adamw)), beta1_(beta1), beta2_(beta2), eps_(eps) {}

void Galore::update(kernels::Ops& ops, const Segment& s, const Hyper& h) const {
    if (!s.matrix) {
        adamw_.update(ops, s, h);
        return;
    }
    // The direction (host memory) up to the backend, a piece at a time, then the step there.
    staged(s.count, s.staging, [&](std::size_t at, std::size_t n) {
        ops.upload(s.staging.data(), s.direction + at, n * sizeof(float));
        ops.galore_update(s.master + at, s.staging.data(), n, h.lr, s.weight_decay,
                          s.params.data ? s.params + at : s.params);
    });
}

void Galore::update_host(const Segment& s, const float* grads, const Hyper& h, std::size_t begin,
                         std::size_t end) const {
    if (!s.matrix) {
        adamw_.update_host(s, grads, h, begin, end);
        return;
    }
    for (std::size_t i = begin; i < end; ++i) {
        const float w = s.master[i] - s.direction[i];
        s.master[i] = w - h.lr * s.weight_decay * w;
    }
}

void Galore::matrix_input(kernels::Ops& ops, const Segment& s, const Hyper& h, float* out) const {
    ops.copy_to_host(out, s.grads, s.count);
    matrix_input_host(s, out, h, out);
}

void Galore::matrix_input_host(const Segment& s, const float* grads, const Hyper& h,
                               float* out) const {
    for (std::size_t i = 0; i < s.count; ++i) out[i] = grads[i] * h.grad_scale;
}

std::size_t Galore::matrix_scratch(std::size_t rows, std::size_t cols) const {
    return std::min(rows * cols, kStaging);
}

std::size_t Galore::rank_of(std::size_t rows, std::size_t cols) const {
    return std::min({static_cast<std::size_t>(config_.rank), rows, cols});
}

std::vector<MatrixStateDecl> Galore::matrix_states(std::size_t rows, std::size_t cols) const {
    const std::size_t r = rank_of(rows, cols);
    const std::size_t moments = r * std::max(rows, cols);
    return {{"exp_avg", moments},
            {"exp_avg_sq", moments},
            {"projector", rows >= cols ? r * cols : rows * r}};
}

void Galore::matrix_step(kernels::Ops&, float* m, std::size_t rows, std::size_t cols,
                         std::span<float* const> state, const Hyper& h, std::span<float>) const {
    const std::size_t r = rank_of(rows, cols);
    float *exp_avg = state[0], *exp_avg_sq = state[1], *p = state[2];
    if ((h.step - 1) % config_.update_gap == 0) new_projector(m, rows, cols, r, p);
    const bool right = rows >= cols;  // P (r, cols) on the right, else (rows, r) on the left
    // R: G·Pᵀ (rows, r) or Pᵀ·G (r, cols).
    const int rr = as_int(r), ro = as_int(rows), co = as_int(cols);
    std::vector<float> low(r * std::max(rows, cols));
    if (right)
        kernels::host_gemm(false, true, ro, rr, co, 1.0f, m, p, 0.0f, low.data());
    else
        kernels::host_gemm(true, false, rr, co, ro, 1.0f, p, m, 0.0f, low.data());
    for (std::size_t i = 0; i < low.size(); ++i) {
        const float g = low[i];
        exp_avg[i] = beta1_ * exp_avg[i] + (1.0f - beta1_) * g;
        exp_avg_sq[i] = beta2_ * exp_avg_sq[i] + (1.0f - beta2_) * g * g;
        low[i] = exp_avg[i] / (std::sqrt(exp_avg_sq[i]) + eps_);
    }
    const double t = h.step;
    const auto step_size =
        static_cast<float>(h.lr * std::sqrt(1.0 - std::pow(static_cast<double>(beta2_), t)) /
                           (1.0 - std::pow(static_cast<double>(beta1_), t)));
    const float alpha = step_size * static_cast<float>(config_.scale);
    // The step: alpha·(N·P) (rows, cols) or alpha·(P·N).
    if (right)
        kernels::host_gemm(false, false, ro, co, rr, alpha, low.data(), p, 0.0f, m);
    else
        kernels::host_gemm(false, false, ro, co, rr, alpha, p, low.data(), 0.0f, m);
}

double Galore::matrix_step_flops(std::size_t rows, std::size_t cols) const {
    const auto r = static_cast<double>(rank_of(rows, cols));
    const auto a = static_cast<double>(std::min(rows, cols));
    const auto mn = static_cast<double>(rows) * static_cast<double>(cols);
    // Projection and projection back: 2·m·n·r each. The thin SVD with both sides' vectors
    // (sgesdd, jobz 'S'): about 6·m·n·min + 20·min³ (docs/FORMULAS.md), every update_gap steps.
    const double svd = 6 * mn * a + 20 * a * a * a;
    return 4 * mn * r + svd / config_.update_gap;
}

}  // namespace trident::optim
