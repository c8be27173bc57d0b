// Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers"; Liu et al. 2025, "Muon is
// scalable for LLM training"): the layers' weight matrices step along their orthogonalized
// momentum, every other parameter (embeddings, the LM head, norms, biases) with AdamW under the
// same training.* hyper-parameters (docs/FORMULAS.md, "Muon"). For a matrix W (A × B, output
// features × input features) with clipped gradient G:
//   buf ← μ·buf + G;  U ← G + μ·buf (nesterov) or buf;  X ← U / (‖U‖_F + 1e-7), transposed if
//   A > B;  ns_steps times: M ← X·Xᵀ, X ← a·X + (b·M + c·M·M)·X, (a, b, c) = (3.4445, −4.7750,
//   2.0315);  O ← X transposed back;  W ← W − lr·wd·W − lr·scale·O,
// scale 0.2·√max(A, B) (moonlight) or √max(1, A/B) (spectral), in fp32; the iterations'
// products in fp32, or in bf16 with optimizer.muon.ns_dtype: bf16 (kernels/ops.h,
// Ops::newton_schulz).
// Its state per parameter: "momentum" (buf) on the matrices, AdamW's "exp_avg" and
// "exp_avg_sq" on the rest, each zero where it does not apply. The momentum and U, and the step
// along O, are element by element on each rank's owned elements, by the op set's kernels on the
// backend's memory (Ops::muon_momentum, muon_update; host loops where optimizer.offload: host
// keeps the state in host memory), staged through the scratch a piece at a time. The
// Newton-Schulz iterations need the whole U, which optim/matrix_exchange.h assembles in host
// memory on one rank per matrix: U comes down from the device, the normalisation and transposes
// are host loops, the iterations go back up to the op set (Ops::newton_schulz: cuBLAS on a GPU)
// in the scratch (matrix_scratch: X, the next X, M and P), and O comes down again.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"

namespace trident::optim {

class Muon final : public Optimizer {
public:
    Muon(const config::MuonConfig& config, AdamW adamw);

    const char* name() const override { return "muon"; }
    const std::vector<std::string>& state_names() const override { return names_; }
    // The momentum for the matrices, AdamW's moments for the rest.
    StateGroup state_group(std::size_t k) const override {
        return k == 0 ? StateGroup::matrices : StateGroup::others;
    }
    // A matrix segment along its direction (scale·O); another with AdamW.
    void update(kernels::Ops& ops, const Segment& s, const Hyper& h) const override;
    // The same on elements [begin, end) in host memory (optimizer.offload: host).
    void update_host(const Segment& s, const float* grads, const Hyper& h, std::size_t begin,
                     std::size_t end) const override;

    bool whole_matrices() const override { return true; }
    // The momentum's step, and U into `out`.
    void matrix_input(kernels::Ops& ops, const Segment& s, const Hyper& h,
                      float* out) const override;
    void matrix_input_host(const Segment& s, const float* grads, const Hyper& h,
                           float* out) const override;
    // U (rows, cols) into scale·O.
    void matrix_step(kernels::Ops& ops, float* m, std::size_t rows, std::size_t cols,
                     std::span<float* const> state, const Hyper& h,
                     std::span<float> scratch) const override;
    // X (rows · cols) and the iterations' newton_schulz_scratch (kernels/ops.h).
    std::size_t matrix_scratch(std::size_t rows, std::size_t cols) const override;
    // ns_steps·(4·a²·b + 2·a³), a = min(rows, cols), b = max (docs/FORMULAS.md).
    double matrix_step_flops(std::size_t rows, std::size_t cols) const override;

private:
    config::MuonConfig config_;
    AdamW adamw_;
    std::vector<std::string> names_{"momentum", "exp_avg", "exp_avg_sq"};
};

}  // namespace trident::optim
