// GaLore (Zhao et al. 2024, "GaLore: memory-efficient LLM training by gradient low-rank
// projection"), as the official GaLoreAdamW with its 'std' projector computes it: each layer
// weight matrix keeps Adam's moments in a rank-r subspace of its gradient, every other parameter
// (embeddings, the LM head, norms, biases) trains with AdamW under the same training.*
// hyper-parameters (docs/FORMULAS.md, "GaLore"). For a matrix W (m × n, output features × input
// features) with clipped gradient G, r = min(rank, m, n), at update t (1-based):
//   at t = 1, 1 + T, 1 + 2T, … (the official steps 0, T, 2T, …; T = update_gap) the projector
//   P is recomputed from G by an fp32 SVD, each singular vector's largest component positive:
//   m ≥ n: P = the first r rows of Vᵀ (r, n), R = G·Pᵀ (m, r);
//   m < n: P = the first r columns of U (m, r), R = Pᵀ·G (r, n);
//   Adam on R: mo ← β1·mo + (1−β1)·R, v ← β2·v + (1−β2)·R², N ← mo / (√v + eps);
//   W ← W − lr·√(1−β2^t)/(1−β1^t)·scale·(N·P or P·N), then W ← W − lr·wd·W.
// The moments outlive a projector's change (as the official code's do).
// Its state: per matrix, held by the rank that steps it (optim/matrix_exchange.h), "exp_avg"
// and "exp_avg_sq" of R (r·max(m, n) each) and "projector" (r·n or m·r); per parameter,
// AdamW's moments on the rest. The SVD and the projections need the whole gradient, which the
// exchange assembles in host memory on one rank per matrix: the gradient comes down from the
// device, and the SVD, the projections and the Adam step on R are host loops and OpenBLAS, on
// the matrix's state brought down from the backend and put back (matrix_exchange.h); the step
// along the direction goes up to the op set's kernel (Ops::galore_update), staged through a
// scratch of at most kStaging floats.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"

namespace trident::optim {

class Galore final : public Optimizer {
public:
    Galore(const config::GaloreConfig& config, AdamW adamw, float beta1, float beta2, float eps);

    const char* name() const override { return "galore"; }
    // AdamW's moments, for the parameters outside the layer matrices.
    const std::vector<std::string>& state_names() const override { return names_; }
    StateGroup state_group(std::size_t) const override { return StateGroup::others; }
    // A matrix segment along its direction, then decayed; another with AdamW.
    void update(kernels::Ops& ops, const Segment& s, const Hyper& h) const override;
    // The same on elements [begin, end) in host memory (optimizer.offload: host).
    void update_host(const Segment& s, const float* grads, const Hyper& h, std::size_t begin,
                     std::size_t end) const override;

    bool whole_matrices() const override { return true; }
    // The clipped gradient into `out`.
    void matrix_input(kernels::Ops& ops, const Segment& s, const Hyper& h,
                      float* out) const override;
    void matrix_input_host(const Segment& s, const float* grads, const Hyper& h,
                           float* out) const override;
    // exp_avg, exp_avg_sq (r·max(rows, cols) each) and projector (r·cols or rows·r).
    std::vector<MatrixStateDecl> matrix_states(std::size_t rows, std::size_t cols) const override;
    // G (rows, cols) into the step lr·√(1−β2^t)/(1−β1^t)·scale·(projected-back N).
    void matrix_step(kernels::Ops& ops, float* m, std::size_t rows, std::size_t cols,
                     std::span<float* const> state, const Hyper& h,
                     std::span<float> scratch) const override;
    // Only the staging of the directions: the matrix's elements, at most kStaging.
    std::size_t matrix_scratch(std::size_t rows, std::size_t cols) const override;
    static constexpr std::size_t kStaging = std::size_t{1} << 20;
    // The projections' products every step and the SVD's every update_gap steps, averaged
    // (docs/FORMULAS.md, "GaLore").
    double matrix_step_flops(std::size_t rows, std::size_t cols) const override;

private:
    std::size_t rank_of(std::size_t rows, std::size_t cols) const;

    config::GaloreConfig config_;
    AdamW adamw_;
    float beta1_, beta2_, eps_;
    std::vector<std::string> names_{"exp_avg", "exp_avg_sq"};
};

}  // namespace trident::optim
