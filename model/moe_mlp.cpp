// A mixture of experts' MLP (`model.moe`, the kind "moe" of the layers it names;
// docs/ARCHITECTURE.md, "Mixture of experts"): a router (gate, N × H, replicated) whose fp32
// logits choose each token's k experts on the host (model/moe_routing.h), N SwiGLU experts
// run as one grouped computation — the tokens' rows permuted by expert, each expert's GEMMs on
// its contiguous rows, the outputs weighted and summed back to their tokens — and the shared
// experts' SwiGLU (an Mlp of width S·F) added ungated. Tensors under the layer's MLP, as
// Qwen3-MoE and DeepSeek-V3 name them: "gate.weight", "gate.e_score_correction_bias" (sigmoid
// only, not trained), "experts.{e}.{gate,up,down}_proj.weight", "shared_experts.{gate,up,
// down}_proj.weight".
//
// Tensor parallelism splits every expert as the dense MLP (gate and up by rows, down by
// columns): each tensor rank routes all N rows alike (all-gathered under sequence
// parallelism), computes its share of every expert and the partial outputs are reduced once.
// The router's input gradient is added on tensor rank 0 only, and each choice's weight
// gradient (a dot product with the expert's partial output) is summed over the tensor group.
// The balancing loss counts the choices of the whole microbatch: summed over the context group.
// A capacity (capacity_factor) gives the choices it drops the weight 0 and takes them out of the
// permutation (model/moe_routing.h): no expert computes them and no exchange moves them.
//
// Expert parallelism (E ranks of the expert group, model/moe_dispatch.h): each rank routes its
// own tokens as above, sends the permuted rows to their experts' ranks, computes its N/E
// experts on every rank's rows sent to them and sends the results back; the backward sends the
// outputs' gradients the same way and the inputs' gradients back. Each rank holds only its
// experts' weights (model/param_layout.h, Split::expert), their gradients summed over the
// expert-shard group and, with hybrid sharding, then across the shard groups
// (src/data_parallel/data_parallel.h). The shared experts compute while the rows travel to their
// experts (forward: the inputs; backward: the outputs' gradients): the trace's ep_shared under
// ep_exchange (src/io/chrome_trace.h), and in the backward the work deferred to it
// (parallel.ep_overlap, model/part_context.h: the attention weight gradients of the layer above,
// ep_attention); a backward that computes its weight gradients too (not a split backward's B)
// computes them while the inputs' gradients travel back (ep_wgrad under ep_exchange).
//
// Shapes (this rank; K = N·k choices, F the expert's width over M, K' the rows its experts
// compute: K, or at most E·N·min(k, N/E) under expert parallelism): logits (N, experts) fp32 and
// the load (experts) kept; the experts' outputs (K, H) in this rank's permuted order, the gate
// and up (K', 2F) and SwiGLU's (K', F) kept for the backward, and under expert parallelism the
// experts' input rows (K', H) and the counts received (experts, i32).
#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "model/mlp.h"
#include "model/moe_dispatch.h"
#include "model/moe_routing.h"
#include "model/part_kinds.h"

namespace trident::model {

namespace {

using kernels::ConstPtr;
using kernels::DType;
using kernels::Ptr;

struct MoeTensors {
    std::size_t router = 0, bias = kNoParam;
    std::vector<std::size_t> gate_up, down;  // per expert (gate's offset; up follows it)
};

class MoeMlp final : public FeedForward {
public:
    MoeMlp(const MoeSettings& moe, MoeTensors tensors, std::unique_ptr<FeedForward> shared,
           const Dims& d, SetSpec& set, ScratchSpec& scratch);

    Ptr forward(PartContext& ctx, const Pass& pass, ConstPtr x, bool to_output) const override;
    ConstPtr backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                      BackwardPart part) const override;
    void backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const override;
    void finish_grads(PartContext& ctx) const override {
        if (shared_) shared_->finish_grads(ctx);
    }
    bool exchanges() const override { return EP_ > 1; }

private:
    // The gradients the weights' backward reads: kept by a split backward's B, else scratch.
    struct WeightGradInputs {
        ConstPtr d_gate_up, d_out, d_logits;
    };
    std::size_t choices() const { return static_cast<std::size_t>(N_) * k_; }
    // The rows this rank's experts compute: without expert parallelism the permutation's own.
    ExpertRows all_local(const MoeRouting& r) const { return {0, r.offset}; }
    ExchangeBuffers exchange_buffers(PartContext& ctx) const {
        return {ctx.ops, *ctx.experts, ctx.scratch[staging_],
                static_cast<int32_t*>(ctx.scratch[index_].data)};
    }
    // The forward's exchange (counts sent, and kept), or the backward's from the kept counts.
    ExpertExchange exchange(PartContext& ctx, const Pass& pass, const MoeRouting& r,
                            bool forward) const;
    // local = the permuted rows (K, H) of every rank for this rank's experts, while `shared`
    // (the shared experts' forward or backward) runs, and the work deferred to this exchange
    // (model/part_context.h: the weight gradients of the attention above, in a backward).
    void dispatch_under(PartContext& ctx, const ExpertExchange& ex, ConstPtr permuted, Ptr local,
                        const std::function<void()>& shared) const;
    // The backward's combine of the experts' input gradients `local` into `permuted`, with
    // `compute` (the layer's weight gradients) run while they travel.
    void combine_under(PartContext& ctx, const ExpertExchange& ex, ConstPtr local, Ptr permuted,
                       const std::function<void()>& compute) const;
    ConstPtr all_rows(PartContext& ctx, const Pass& pass, ConstPtr x) const;
    // The routing of the kept logits (copied to `logits` when given), and the permutation's
    // tokens on the device.
    MoeRouting routing(PartContext& ctx, const Pass& pass,
                       std::vector<float>* logits = nullptr) const;
    void count_load(PartContext& ctx, const Pass& pass, const MoeRouting& r,
                    bool count_losses) const;
    // Each kept choice's weight in permuted order (r.permuted()) fp32, in the scratch.
    const float* permuted_weights(PartContext& ctx, const MoeRouting& r) const;
    void permute(PartContext& ctx, const MoeRouting& r, Ptr out, ConstPtr rows, int width) const;
    void unpermute_add(PartContext& ctx, const MoeRouting& r, Ptr out, ConstPtr permuted,
                       int width) const;
    // Of the experts r computes, one tensor each (t_.gate_up or t_.down): the weights, the
    // gradients.
    std::vector<ConstPtr> expert_params(PartContext& ctx, const ExpertRows& r,
                                        const std::vector<std::size_t>& tensors) const;
    std::vector<Ptr> expert_grads(PartContext& ctx, const ExpertRows& r,
                                  const std::vector<std::size_t>& tensors) const;
    void experts_forward(PartContext& ctx, const Pass& pass, const ExpertRows& r, ConstPtr x,
                         Ptr out) const;
    void experts_backward(PartContext& ctx, const Pass& pass, const ExpertRows& r, ConstPtr x,
                          ConstPtr d_out, Ptr d_gate_up, Ptr d_x) const;
    void router_backward(PartContext& ctx, const Pass& pass, const MoeRouting& r,
                         const std::vector<float>& logits, ConstPtr dy_perm, Ptr d_logits) const;
    void weight_grads(PartContext& ctx, const Pass& pass, ConstPtr x_all, const MoeRouting& r,
                      const WeightGradInputs& g) const;

    MoeSettings moe_;
    MoeTensors t_;
    std::unique_ptr<FeedForward> shared_;
    int N_, R_, H_, F_, E_, k_, C_, tensor_rank_;
    int EP_;                                                          // expert ranks
    int x_local_ = -1, received_ = -1, staging_, index_, local_out_;  // expert parallelism
    int d_out_local_, d_x_back_;
    int x_all_, logits_, load_, gate_up_, hidden_, out_;             // slots
    int x_perm_, partial_, reduced_, ring_sums_, weights_, dy_all_;  // scratch
    int dy_perm_, d_hidden_, d_gate_up_, d_x_perm_, d_logits_;       // scratch
    int tokens_, dots_, ones_, bias_, stats_;                        // scratch
    WeightGradStash keep_d_gate_up_, keep_d_out_, keep_d_logits_;
};

MoeMlp::MoeMlp(const MoeSettings& moe, MoeTensors tensors, std::unique_ptr<FeedForward> shared,
               const Dims& d, SetSpec& set, ScratchSpec& scratch)
    : moe_(moe),
      t_(std::move(tensors)),
      shared_(std::move(shared)),
      N_(d.N),
      R_(d.R),
      H_(d.H),
      F_(moe.ffn_hidden / d.M),
      E_(moe.experts),
      k_(moe.top_k),
      C_(d.C),
      tensor_rank_(d.tensor_rank),
      EP_(d.expert_ranks) {
    const std::size_t N = d.rows(), R = d.rows_mine(), K = choices(), H = d.H, F = F_;
    const std::size_t E = static_cast<std::size_t>(E_);
    const bool sp = d.sequence_parallel, ep = exchanges();
    // Rows this rank's experts compute: at most min(k, N/E) choices of each token of E ranks.
    const std::size_t EP = static_cast<std::size_t>(EP_);
    const std::size_t L = std::min<std::size_t>(static_cast<std::size_t>(k_), E / EP);
    const std::size_t Kl = ep ? EP * N * L : K;
    x_all_ = sp ? set.add("moe_input_all", N * H, d.act, Keep::unless_full) : -1;
    logits_ = set.add("moe_logits", N * E, DType::f32, Keep::unless_full);
    load_ = set.add("moe_load", E, DType::f32, Keep::unless_full);
    gate_up_ = set.add("moe_gate_up", Kl * 2 * F, d.act, Keep::unless_full);
    hidden_ = set.add("moe_swiglu", Kl * F, d.act, Keep::unless_full);
    out_ = set.add("moe_expert_out", K * H, d.act, Keep::unless_full);
    keep_d_gate_up_ = WeightGradStash(set, "moe_d_gate_up", Kl * 2 * F, d.act);
    keep_d_out_ = WeightGradStash(set, "moe_d_expert_out", Kl * H, d.act);
    keep_d_logits_ = WeightGradStash(set, "moe_d_logits", N * E, DType::f32);
    x_perm_ = scratch.add("moe_input_permuted", K * H, d.act);
    partial_ = scratch.add("moe_partial", N * H, d.act);
    reduced_ = scratch.add("moe_reduced", R * H, d.act);
    ring_sums_ = scratch.add("moe_ring_sums", sp ? 2 * R * H : 0, d.act);
    weights_ = scratch.add("moe_weights", K, DType::f32);
    dy_all_ = scratch.add("moe_d_output_all", sp ? N * H : 0, d.act);
    dy_perm_ = scratch.add("moe_d_output_permuted", K * H, d.act);
    d_hidden_ = scratch.add("moe_d_swiglu", Kl * F, d.act);
    d_gate_up_ = scratch.add("moe_d_gate_up", Kl * 2 * F, d.act);
    d_x_perm_ = scratch.add("moe_d_input_permuted", Kl * H, d.act);
    d_logits_ = scratch.add("moe_d_logits", N * E, DType::f32);
    tokens_ = scratch.add("moe_tokens", K, DType::i32);
    dots_ = scratch.add("moe_weight_grads", K, DType::f32);
    ones_ = scratch.add("moe_ones", H, DType::f32);
    bias_ = scratch.add("moe_bias", E, DType::f32);
    if (ep) {
        x_local_ = set.add("moe_expert_input", Kl * H, d.act, Keep::unless_full);
        received_ = set.add("moe_received", E, DType::i32, Keep::unless_full);
    }
    staging_ = scratch.add("moe_exchange", ep ? std::max(K, Kl) * H : 0, d.act);
    index_ = scratch.add("moe_exchange_rows", ep ? Kl : 0, DType::i32);
    local_out_ = scratch.add("moe_expert_out_local", ep ? Kl * H : 0, d.act);
    d_out_local_ = scratch.add("moe_d_expert_out_local", ep ? Kl * H : 0, d.act);
    d_x_back_ = scratch.add("moe_d_input_returned", ep ? K * H : 0, d.act);
    stats_ = scratch.add("moe_stats", 2 * E + 2, DType::f32);
}

// All N rows of the input: all-gathered (kept for the backward) under sequence parallelism.
ConstPtr MoeMlp::all_rows(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    return x_all_ < 0 ? x
                      : ctx.rows.all_rows(x, pass.buffers[x_all_], static_cast<std::size_t>(H_));
}

MoeRouting MoeMlp::routing(PartContext& ctx, const Pass& pass, std::vector<float>* kept) const {
    const std::size_t E = static_cast<std::size_t>(E_);
    std::vector<float> logits(static_cast<std::size_t>(N_) * E), bias;
    ctx.ops.download(logits.data(), pass.buffers[logits_].data, logits.size() * sizeof(float));
    if (t_.bias != kNoParam) {  // in the parameters' type: widened on the device
        bias.resize(E);
        ctx.ops.convert(ctx.scratch[bias_], ctx.weights.params.at(t_.bias), E);
        ctx.ops.download(bias.data(), ctx.scratch[bias_].data, E * sizeof(float));
    }
    MoeRouting r = route(moe_, logits.data(), bias.empty() ? nullptr : bias.data(), N_);
    ctx.ops.upload(ctx.scratch[tokens_].data, r.token.data(), r.token.size() * sizeof(int32_t));
    if (kept) *kept = std::move(logits);
    return r;
}

// The load f_e of the balancing loss: the fraction of the microbatch's choices (its whole
// sequences: summed over the context group) that went to expert e, kept for the backward; and,
// for the metrics and the bias's update, the choices of each expert and the layer's balancing
// loss N·Σ f_e·P_e and z-loss mean (logsumexp z)² over the microbatch, counted once per
// microbatch (context rank 0).
void MoeMlp::count_load(PartContext& ctx, const Pass& pass, const MoeRouting& r,
                        bool count_losses) const {
    const std::size_t E = static_cast<std::size_t>(E_);
    std::vector<float> stats(2 * E + 2, 0.0f);  // counts (E), Σ_t p (E), Σ_t lse², dropped
    for (std::size_t e = 0; e < E; ++e) stats[e] = static_cast<float>(r.chosen[e]);
    stats[2 * E + 1] = static_cast<float>(r.dropped_count);
    for (std::size_t t = 0; t < static_cast<std::size_t>(N_); ++t) {
        for (std::size_t e = 0; e < E; ++e) stats[E + e] += r.probs[t * E + e];
        stats[2 * E] += r.lse[t] * r.lse[t];
    }
    const Ptr buffer = ctx.scratch[stats_];
    ctx.ops.upload(buffer.data, stats.data(), stats.size() * sizeof(float));
    if (ctx.context.size() > 1) ctx.context.all_reduce(buffer, stats.size());
    ctx.ops.download(stats.data(), buffer.data, stats.size() * sizeof(float));
    const float tokens = static_cast<float>(N_) * static_cast<float>(C_);
    std::vector<float> load(E);
    for (std::size_t e = 0; e < E; ++e) load[e] = stats[e] / (tokens * static_cast<float>(k_));
    ctx.ops.upload(pass.buffers[load_].data, load.data(), E * sizeof(float));
    if (!count_losses || !ctx.moe_losses || ctx.context.rank() != 0) return;
    std::vector<double>& tokens_of = ctx.moe_losses->tokens;
    const std::size_t first = static_cast<std::size_t>(pass.layer) * E;
    tokens_of.resize(std::max(tokens_of.size(), first + E));
    for (std::size_t e = 0; e < E; ++e) tokens_of[first + e] += stats[e];
    std::vector<double>& dropped = ctx.moe_losses->dropped;
    dropped.resize(std::max(dropped.size(), static_cast<std::size_t>(pass.layer) + 1));
    dropped[static_cast<std::size_t>(pass.layer)] += stats[2 * E + 1];
    double aux = 0;
    for (std::size_t e = 0; e < E; ++e) aux += static_cast<double>(load[e]) * stats[E + e] / tokens;
    ctx.moe_losses->aux += static_cast<double>(E) * aux;
    ctx.moe_losses->z += static_cast<double>(stats[2 * E]) / tokens;
}

const float* MoeMlp::permuted_weights(PartContext& ctx, const MoeRouting& r) const {
    std::vector<float> permuted(static_cast<std::size_t>(r.permuted()));
    for (std::size_t c = 0; c < choices(); ++c)
        if (r.row_of[c] >= 0) permuted[static_cast<std::size_t>(r.row_of[c])] = r.weight[c];
    const Ptr w = ctx.scratch[weights_];
    ctx.ops.upload(w.data, permuted.data(), permuted.size() * sizeof(float));
    return static_cast<const float*>(w.data);
}

// out (P, width) = rows (N, width) of each permuted choice's token (P = r.permuted()): a row
// gather, which is the embedding's lookup of the permutation's tokens in a table of the N rows.
void MoeMlp::permute(PartContext& ctx, const MoeRouting& r, Ptr out, ConstPtr rows,
                     int width) const {
    const auto* tokens = static_cast<const int32_t*>(ctx.scratch[tokens_].data);
    ctx.ops.embedding_forward(out, tokens, rows, nullptr, 1, r.permuted(), width, 0, N_, nullptr,
                              0);
}

// out (N, width) += each token's permuted rows (P, width): the embedding's scatter-add.
void MoeMlp::unpermute_add(PartContext& ctx, const MoeRouting& r, Ptr out, ConstPtr permuted,
                           int width) const {
    const auto* tokens = static_cast<const int32_t*>(ctx.scratch[tokens_].data);
    ctx.ops.embedding_backward(out, nullptr, permuted, tokens, 1, r.permuted(), width, 0, N_,
                               nullptr, 0);
}

std::vector<ConstPtr> MoeMlp::expert_params(PartContext& ctx, const ExpertRows& r,
                                            const std::vector<std::size_t>& tensors) const {
    std::vector<ConstPtr> params;
    for (int j = 0; j < r.experts(); ++j)
        params.push_back(ctx.weights.params.at(tensors[static_cast<std::size_t>(r.first + j)]));
    return params;
}

std::vector<Ptr> MoeMlp::expert_grads(PartContext& ctx, const ExpertRows& r,
                                      const std::vector<std::size_t>& tensors) const {
    std::vector<Ptr> grads;
    for (int j = 0; j < r.experts(); ++j)
        grads.push_back(ctx.weights.grads.at(tensors[static_cast<std::size_t>(r.first + j)]));
    return grads;
}

// The experts' GEMMs, each on its contiguous rows, one grouped op of each kind (Ops's grouped
// linear): out (rows, H) from x (rows, H).
void MoeMlp::experts_forward(PartContext& ctx, const Pass& pass, const ExpertRows& r, ConstPtr x,
                             Ptr out) const {
    const Ptr gate_up = pass.buffers[gate_up_], hidden = pass.buffers[hidden_];
    ctx.ops.grouped_matmul_forward(gate_up, x, expert_params(ctx, r, t_.gate_up).data(),
                                   r.offset.data(), r.experts(), H_, 2 * F_);
    ctx.ops.swiglu_forward(hidden, gate_up, r.rows(), F_);
    ctx.ops.grouped_matmul_forward(out, hidden, expert_params(ctx, r, t_.down).data(),
                                   r.offset.data(), r.experts(), F_, H_);
}

ExpertExchange MoeMlp::exchange(PartContext& ctx, const Pass& pass, const MoeRouting& r,
                                bool forward) const {
    const Ptr kept = pass.buffers[received_];
    if (forward) {
        ExpertExchange ex = ExpertExchange::plan(*ctx.experts, r);
        ctx.ops.upload(kept.data, ex.received().data(), ex.received().size() * sizeof(int32_t));
        return ex;
    }
    std::vector<int32_t> received(static_cast<std::size_t>(E_));
    ctx.ops.download(received.data(), kept.data, received.size() * sizeof(int32_t));
    return ExpertExchange(ctx.experts->size(), ctx.experts->rank(), r, std::move(received));
}

void MoeMlp::dispatch_under(PartContext& ctx, const ExpertExchange& ex, ConstPtr permuted,
                            Ptr local, const std::function<void()>& shared) const {
    const ExchangeBuffers b = exchange_buffers(ctx);
    const double issued = ctx.rows.trace_now();
    parallel::Request sent = ex.start_dispatch(b, permuted, H_);
    if (shared_) ctx.rows.run_traced(PieceKind::expert, 0, shared);
    if (ctx.deferred && *ctx.deferred)
        ctx.rows.run_traced(PieceKind::attention_wgrad, 0, [&ctx] { ctx.deferred->run(); });
    ctx.rows.wait_traced(PieceKind::expert, 0, sent, issued);
    ex.finish_dispatch(b, sent, local, H_);
}

void MoeMlp::combine_under(PartContext& ctx, const ExpertExchange& ex, ConstPtr local, Ptr permuted,
                           const std::function<void()>& compute) const {
    const double issued = ctx.rows.trace_now();
    parallel::Request sent = ex.start_combine(exchange_buffers(ctx), local, permuted, H_);
    ctx.rows.run_traced(PieceKind::expert_combine, 0, compute);
    ctx.rows.wait_traced(PieceKind::expert_combine, 0, sent, issued);
}

Ptr MoeMlp::forward(PartContext& ctx, const Pass& pass, ConstPtr x, bool to_output) const {
    Ptr shared;
    const auto run_shared = [&] {
        if (shared_) shared = shared_->forward(ctx, pass, x, to_output);
    };
    const ConstPtr x_all = all_rows(ctx, pass, x);
    ctx.ops.matmul_forward(pass.buffers[logits_], x_all, ctx.weights.params.at(t_.router), nullptr,
                           N_, H_, E_);
    const MoeRouting r = routing(ctx, pass);
    count_load(ctx, pass, r, pass.training && to_output);
    permute(ctx, r, ctx.scratch[x_perm_], x_all, H_);
    if (exchanges()) {  // the rows to their experts' ranks, the outputs back
        const ExpertExchange ex = exchange(ctx, pass, r, true);
        const Ptr x_local = pass.buffers[x_local_], out_local = ctx.scratch[local_out_];
        dispatch_under(ctx, ex, ctx.scratch[x_perm_], x_local, run_shared);
        experts_forward(ctx, pass, ex.local(), x_local, out_local);
        ex.combine(exchange_buffers(ctx), out_local, pass.buffers[out_], H_);
    } else {
        run_shared();
        experts_forward(ctx, pass, all_local(r), ctx.scratch[x_perm_], pass.buffers[out_]);
    }
    if (!to_output) return Ptr();
    const std::size_t H = static_cast<std::size_t>(H_);
    const Ptr weighted = ctx.scratch[x_perm_], partial = ctx.scratch[partial_];
    ctx.ops.scale_rows(weighted, pass.buffers[out_], permuted_weights(ctx, r),
                       static_cast<std::size_t>(r.permuted()), H);
    ctx.ops.zero(partial, static_cast<std::size_t>(N_) * H);
    unpermute_add(ctx, r, partial, weighted, H_);
    const Ptr mine =
        ctx.rows.reduce_rows(partial, ctx.scratch[reduced_], H, ctx.scratch[ring_sums_]);
    if (shared) ctx.ops.residual_forward(mine, mine, shared, static_cast<std::size_t>(R_) * H);
    return mine;
}

// d_logits (N, experts) fp32: from each choice's weight gradient, the dot product of dy with
// the expert's output (partial over the tensor group: summed), and the router's losses.
void MoeMlp::router_backward(PartContext& ctx, const Pass& pass, const MoeRouting& r,
                             const std::vector<float>& logits, ConstPtr dy_perm,
                             Ptr d_logits) const {
    const std::size_t K = choices(), P = static_cast<std::size_t>(r.permuted()),
                      H = static_cast<std::size_t>(H_);
    const Ptr products = ctx.scratch[x_perm_], dots = ctx.scratch[dots_];
    const Ptr ones = ctx.scratch[ones_];
    const std::vector<float> one(H, 1.0f);
    ctx.ops.upload(ones.data, one.data(), H * sizeof(float));
    ctx.ops.multiply(products, dy_perm, pass.buffers[out_], P * H, 1.0f);
    ctx.ops.matmul_forward(dots, products, ones, nullptr, static_cast<int>(P), H_, 1);
    if (ctx.rows.group().size() > 1) ctx.rows.group().all_reduce(dots, P);
    std::vector<float> permuted(P), d_weight(K, 0.0f), load(static_cast<std::size_t>(E_));
    ctx.ops.download(permuted.data(), dots.data, P * sizeof(float));
    for (std::size_t c = 0; c < K; ++c)  // a dropped choice's: 0
        if (r.row_of[c] >= 0) d_weight[c] = permuted[static_cast<std::size_t>(r.row_of[c])];
    ctx.ops.download(load.data(), pass.buffers[load_].data, load.size() * sizeof(float));
    std::vector<float> dz(logits.size(), 0.0f);
    route_backward(moe_, r, logits.data(), d_weight.data(), {load.data(), pass.dloss}, dz.data());
    ctx.ops.upload(d_logits.data, dz.data(), dz.size() * sizeof(float));
}

// d_gate_up (rows, 2F) and the experts' input gradient d_x (rows, H) from the gradient of the
// experts' weighted outputs d_out (rows, H), each expert on its rows (x, their input, is not
// read for the input's gradient alone).
void MoeMlp::experts_backward(PartContext& ctx, const Pass& pass, const ExpertRows& r, ConstPtr x,
                              ConstPtr d_out, Ptr d_gate_up, Ptr d_x) const {
    const std::size_t K = static_cast<std::size_t>(r.rows()), H = static_cast<std::size_t>(H_),
                      F = static_cast<std::size_t>(F_);
    const Ptr d_hidden = ctx.scratch[d_hidden_], hidden = pass.buffers[hidden_];
    ctx.ops.zero(d_hidden, K * F);
    ctx.ops.grouped_matmul_backward(d_hidden, nullptr, d_out, hidden,
                                    expert_params(ctx, r, t_.down).data(), r.offset.data(),
                                    r.experts(), F_, H_);
    ctx.ops.zero(d_gate_up, K * 2 * F);
    ctx.ops.swiglu_backward(d_gate_up, pass.buffers[gate_up_], d_hidden, r.rows(), F_);
    ctx.ops.zero(d_x, K * H);
    ctx.ops.grouped_matmul_backward(d_x, nullptr, d_gate_up, x,
                                    expert_params(ctx, r, t_.gate_up).data(), r.offset.data(),
                                    r.experts(), H_, 2 * F_);
}

ConstPtr MoeMlp::backward(PartContext& ctx, const Pass& pass, ConstPtr x, ConstPtr dy,
                          BackwardPart part) const {
    ConstPtr d_shared;
    const auto run_shared = [&] {
        if (shared_) d_shared = shared_->backward(ctx, pass, x, dy, part);
    };
    std::vector<float> logits;
    const MoeRouting r = routing(ctx, pass, &logits);
    const std::size_t H = static_cast<std::size_t>(H_), P = static_cast<std::size_t>(r.permuted());
    const ConstPtr x_all = x_all_ < 0 ? x : ConstPtr(pass.buffers[x_all_]);
    const ConstPtr dy_all = ctx.rows.all_rows(dy, ctx.scratch[dy_all_], H);
    const Ptr dy_perm = ctx.scratch[dy_perm_], d_logits = ctx.scratch[d_logits_];
    permute(ctx, r, dy_perm, dy_all, H_);
    router_backward(ctx, pass, r, logits, dy_perm, d_logits);
    ctx.ops.scale_rows(dy_perm, dy_perm, permuted_weights(ctx, r), P, H);
    const Ptr d_gate_up = ctx.scratch[d_gate_up_], d_x = ctx.scratch[d_x_perm_];
    Ptr d_out = dy_perm, d_x_mine = d_x;
    const auto grads = [&] {
        if (part == BackwardPart::both)
            weight_grads(ctx, pass, x_all, r, {d_gate_up, d_out, d_logits});
    };
    if (exchanges()) {  // the outputs' gradients to the experts' ranks, the inputs' back
        const ExpertExchange ex = exchange(ctx, pass, r, false);
        d_out = ctx.scratch[d_out_local_];
        d_x_mine = ctx.scratch[d_x_back_];
        dispatch_under(ctx, ex, dy_perm, d_out, run_shared);
        experts_backward(ctx, pass, ex.local(), pass.buffers[x_local_], d_out, d_gate_up, d_x);
        if (part == BackwardPart::both)
            combine_under(ctx, ex, d_x, d_x_mine, grads);
        else
            ex.combine(exchange_buffers(ctx), d_x, d_x_mine, H_);
    } else {
        run_shared();
        experts_backward(ctx, pass, all_local(r), ctx.scratch[x_perm_], d_out, d_gate_up, d_x);
        grads();
    }
    const Ptr partial = ctx.scratch[partial_];
    ctx.ops.zero(partial, static_cast<std::size_t>(N_) * H);
    unpermute_add(ctx, r, partial, d_x_mine, H_);
    // Every tensor rank computes the router's whole input gradient: one adds it to the sum.
    if (tensor_rank_ == 0)
        ctx.ops.matmul_backward(partial, nullptr, nullptr, d_logits, x_all,
                                ctx.weights.params.at(t_.router), N_, H_, E_);
    keep_d_gate_up_.keep(ctx, pass, part, d_gate_up);
    keep_d_out_.keep(ctx, pass, part, d_out);
    keep_d_logits_.keep(ctx, pass, part, d_logits);
    const Ptr mine =
        ctx.rows.reduce_rows(partial, ctx.scratch[reduced_], H, ctx.scratch[ring_sums_]);
    if (d_shared) ctx.ops.residual_forward(mine, mine, d_shared, static_cast<std::size_t>(R_) * H);
    return mine;
}

void MoeMlp::backward_weight(PartContext& ctx, const Pass& pass, ConstPtr x) const {
    if (shared_) shared_->backward_weight(ctx, pass, x);
    const MoeRouting r = routing(ctx, pass);
    const ConstPtr x_all = x_all_ < 0 ? x : ConstPtr(pass.buffers[x_all_]);
    weight_grads(ctx, pass, x_all, r,
                 {keep_d_gate_up_.kept(pass), keep_d_out_.kept(pass), keep_d_logits_.kept(pass)});
}

// The experts' and the router's weight gradients (the bias trains not): each expert this rank
// computes from its rows' inputs (re-permuted, or kept under expert parallelism).
void MoeMlp::weight_grads(PartContext& ctx, const Pass& pass, ConstPtr x_all, const MoeRouting& r,
                          const WeightGradInputs& g) const {
    if (ctx.weights.frozen) return;
    const Ptr hidden = pass.buffers[hidden_];
    ConstPtr x_rows;
    ExpertRows rows;
    if (exchanges()) {
        rows = exchange(ctx, pass, r, false).local();
        x_rows = pass.buffers[x_local_];
    } else {
        rows = all_local(r);
        permute(ctx, r, ctx.scratch[x_perm_], x_all, H_);
        x_rows = ctx.scratch[x_perm_];
    }
    ctx.ops.grouped_matmul_backward(nullptr, expert_grads(ctx, rows, t_.gate_up).data(),
                                    g.d_gate_up, x_rows, nullptr, rows.offset.data(),
                                    rows.experts(), H_, 2 * F_);
    ctx.ops.grouped_matmul_backward(nullptr, expert_grads(ctx, rows, t_.down).data(), g.d_out,
                                    hidden, nullptr, rows.offset.data(), rows.experts(), F_, H_);
    ctx.ops.matmul_backward(nullptr, ctx.weights.grads.at(t_.router), nullptr, g.d_logits, x_all,
                            ctx.weights.params.at(t_.router), N_, H_, E_);
}

// ---- the kind (model/part_registry.cpp) ------------------------------------------------------

PartDecl moe_mlp_tensors(const GptShape& s) {
    const MoeSettings& moe = s.moe;
    const int64_t H = s.hidden, F = moe.ffn_hidden, E = moe.experts;
    const Split rows{SplitKind::column}, columns{SplitKind::row};
    PartDecl decl;
    decl.tensors.push_back({"gate.weight", {E, H}, {}, Init::normal, true});
    decl.gemms.push_back({"gate", E, H, {}, 1.0});
    if (moe.router == MoeRouter::sigmoid)
        decl.tensors.push_back(
            {"gate.e_score_correction_bias", {E}, {}, Init::zeros, false, false});
    // Each routed expert runs on the tokens routed to it: top_k / N of them on average.
    const double share = static_cast<double>(moe.top_k) / static_cast<double>(E);
    for (int64_t e = 0; e < E; ++e) {
        const std::string name = "experts." + std::to_string(e) + ".";
        const Split expert_rows{SplitKind::column, 1, 0, static_cast<int>(e)},
            expert_columns{SplitKind::row, 1, 0, static_cast<int>(e)};
        decl.tensors.push_back(
            {name + "gate_proj.weight", {F, H}, expert_rows, Init::normal, true});
        decl.tensors.push_back({name + "up_proj.weight", {F, H}, expert_rows, Init::normal, true});
        decl.tensors.push_back(
            {name + "down_proj.weight", {H, F}, expert_columns, Init::normal, true});
        decl.gemms.push_back({name + "gate_proj", F, H, rows, share});
        decl.gemms.push_back({name + "up_proj", F, H, rows, share});
        decl.gemms.push_back({name + "down_proj", H, F, columns, share});
    }
    if (moe.shared_experts == 0) return decl;
    const int64_t S = moe.shared_experts * F;
    decl.tensors.push_back({"shared_experts.gate_proj.weight", {S, H}, rows, Init::normal, true});
    decl.tensors.push_back({"shared_experts.up_proj.weight", {S, H}, rows, Init::normal, true});
    decl.tensors.push_back(
        {"shared_experts.down_proj.weight", {H, S}, columns, Init::normal, true});
    decl.linears = {{"shared_experts.gate_proj", S, H, rows, LoraTarget::gate},
                    {"shared_experts.up_proj", S, H, rows, LoraTarget::up},
                    {"shared_experts.down_proj", H, S, columns, LoraTarget::down}};
    return decl;
}

std::unique_ptr<FeedForward> build_moe_mlp(const PartBuild& in) {
    const MoeSettings& moe = in.shape().moe;
    const Dims& d = in.d;
    MoeTensors t;
    std::size_t i = 0;
    t.router = in.tensor(i++);
    if (moe.router == MoeRouter::sigmoid) t.bias = in.tensor(i++);
    for (int e = 0; e < moe.experts; ++e, i += 3) {
        t.gate_up.push_back(in.tensor(i));
        t.down.push_back(in.tensor(i + 2));
    }
    std::unique_ptr<FeedForward> shared;
    if (moe.shared_experts > 0) {  // one SwiGLU MLP S times an expert's width
        Dims wide = d;
        wide.Fm = moe.shared_experts * moe.ffn_hidden / d.M;
        const LinearSpec gate_up =
            in.linear(LinearSplit::column, d.H, 2 * wide.Fm, in.tensor(i), kNoParam);
        const LinearSpec down =
            in.linear(LinearSplit::row, wide.Fm, d.H, in.tensor(i + 2), kNoParam);
        shared =
            std::make_unique<Mlp>(swiglu_activation(), gate_up, down, wide, in.set, in.scratch);
    }
    return std::make_unique<MoeMlp>(moe, std::move(t), std::move(shared), d, in.set, in.scratch);
}

// Korthikanti et al.'s terms (docs/FORMULAS.md): the router's input 2 and each choice's
// output H whole; each choice's gate, up and product, and the shared experts', split.
ActivationTerms moe_mlp_activations(const GptShape& s, int) {
    const MoeSettings& moe = s.moe;
    const double width = static_cast<double>(moe.ffn_hidden) / s.hidden;
    return {2.0 + 2.0 * moe.top_k, 6.0 * width * (moe.top_k + moe.shared_experts), 0};
}

}  // namespace

extern const MlpKind moe_mlp_kind{"moe", moe_mlp_tensors, build_moe_mlp, moe_mlp_activations};

}  // namespace trident::model
