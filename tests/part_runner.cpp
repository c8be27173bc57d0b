// One part of the model run on its own (see part_runner.h).
#include "part_runner.h"

#include <memory>

namespace trident::test {

namespace {

using namespace part_runner;
using kernels::DeviceBuffer;

// A device buffer holding `values`.
DeviceBuffer upload(kernels::Ops& ops, const std::vector<float>& values) {
    DeviceBuffer b(ops, values.size());
    ops.copy_from_host(b.data(), values.data(), values.size());
    return b;
}

std::vector<float> download(kernels::Ops& ops, ConstPtr from, std::size_t count) {
    std::vector<float> host(count);
    ops.copy_to_host(host.data(), from, count);
    return host;
}

// The set's buffers, every one allocated, and the pass over them.
struct Run {
    std::vector<DeviceBuffer> set;
    model::SetBuffers buffers{{}};
    model::Scratch scratch;
    Run(kernels::Ops& ops, const Bench& b) : scratch(ops, b.scratch_spec.buffers()) {
        std::vector<Ptr> ptrs;
        for (const model::BufferSpec& s : b.set.buffers()) {
            set.emplace_back(ops, s.count, s.dtype);
            ptrs.push_back(set.back().data());
        }
        buffers = model::SetBuffers(std::move(ptrs));
    }
};

// The gradients of the part's tensors (`names`), whole.
void add_grads(Bench& b, parallel::Comm& tensor, const std::vector<std::string>& names,
               Tensors& out) {
    std::vector<float> whole = model::share_of_whole(b.layout, b.weights.grads.to_host(), b.whole);
    tensor.all_reduce(whole.data(), whole.size());
    for (const std::string& name : names) {
        const model::ParamTensor* t = b.whole.find(name);
        out["grad/" + name].assign(whole.begin() + t->offset, whole.begin() + t->offset + t->numel);
    }
}

// A layer's part (norm, attention, MLP) from x (N, H) and dy (N, H); its kind must be the
// spec's.
struct LayerPart {
    model::LayerPart place;
    std::unique_ptr<model::Norm> norm;
    std::unique_ptr<model::Attention> attention;
    std::unique_ptr<model::FeedForward> mlp;
};

LayerPart build_layer_part(Bench& b, const std::string& part) {
    const model::LayerSpec& spec = b.layout.spec().layers[0];
    const std::string kind = part.substr(part.find(':') + 1);
    const auto build = [&](model::LayerPart p) { return b.build(b.layout.layer(0).of(p)); };
    LayerPart l;
    if (part.rfind("norm:", 0) == 0 && kind == spec.norm->name) {
        l.place = model::LayerPart::norm1;
        l.norm = spec.norm->build(build(l.place));
    } else if (part.rfind("attention:", 0) == 0 && kind == spec.attention->name) {
        l.place = model::LayerPart::attention;
        l.attention = spec.attention->build(build(l.place));
    } else if (part.rfind("mlp:", 0) == 0 && kind == spec.mlp->name) {
        l.place = model::LayerPart::mlp;
        l.mlp = spec.mlp->build(build(l.place));
    } else {
        throw Error("part_check: no part " + part + " in a " +
                    (b.layout.shape().arch == model::Arch::llama ? "llama" : "gpt2") + " layer");
    }
    return l;
}

Tensors run_layer_part(kernels::Ops& ops, Bench& b, const PartCase& c, const Tensors& in,
                       parallel::Comm& tensor) {
    const LayerPart l = build_layer_part(b, c.part);
    Run run(ops, b);
    model::PartContext ctx{ops, b.rows, b.alone, b.alone, b.weights, run.scratch};
    const model::Pass pass{run.buffers, false, 0, 0};
    const std::size_t H = static_cast<std::size_t>(b.d.H), R = b.d.rows_mine();
    const DeviceBuffer x = upload(ops, rows_of(b, input(in, "x"), H, tensor.rank()));
    const DeviceBuffer dy = upload(ops, rows_of(b, input(in, "dy"), H, tensor.rank()));
    Tensors out;
    ConstPtr y, dx;
    DeviceBuffer norm_dx(ops, R * H);
    if (l.norm) {
        y = l.norm->forward(ctx, pass, x.data());
        out["y"] = download(ops, y, R * H);
        l.norm->backward(ctx, pass, x.data(), dy.data(), norm_dx.data(), model::BackwardPart::both);
        dx = norm_dx.data();
        l.norm->finish_grads(ctx);
    } else if (l.attention) {
        out["y"] = download(ops, l.attention->forward(ctx, pass, x.data(), 0.0f), R * H);
        dx = l.attention->backward(ctx, pass, x.data(), dy.data(), 0.0f, model::BackwardPart::both,
                                   false);
        l.attention->finish_grads(ctx);
    } else {
        out["y"] = download(ops, l.mlp->forward(ctx, pass, x.data(), true), R * H);
        dx = l.mlp->backward(ctx, pass, x.data(), dy.data(), model::BackwardPart::both);
        l.mlp->finish_grads(ctx);
    }
    out["y"] = whole_rows(b, tensor, out["y"]);
    out["dx"] = whole_rows(b, tensor, download(ops, dx, R * H));
    std::vector<std::string> names;
    const model::NamedPart part = b.layout.spec().layer_parts(0)[static_cast<std::size_t>(l.place)];
    for (const model::TensorDecl& t : part.decl.tensors) names.push_back(part.prefix + t.name);
    add_grads(b, tensor, names, out);
    return out;
}

// The GELU MLP's c_fc (column-split, H -> F) or c_proj (row-split, F -> H) alone.
Tensors run_linear(kernels::Ops& ops, Bench& b, const PartCase& c, const Tensors& in,
                   parallel::Comm& tensor) {
    const bool column = c.part == "linear:column";
    const std::vector<std::size_t>& t = b.layout.layer(0).of(model::LayerPart::mlp);
    const std::size_t N = b.d.rows(), H = static_cast<std::size_t>(b.d.H),
                      Fm = static_cast<std::size_t>(b.d.Fm);
    const model::LinearSpec spec{column ? model::LinearSplit::column : model::LinearSplit::row,
                                 static_cast<int>(column ? H : Fm),
                                 static_cast<int>(column ? Fm : H),
                                 t[column ? 0 : 2],
                                 t[column ? 1 : 3],
                                 {},
                                 true,
                                 c.gemm};
    const model::Linear linear(spec, b.d, b.set, b.scratch_spec);
    Run run(ops, b);
    model::PartContext ctx{ops, b.rows, b.alone, b.alone, b.weights, run.scratch};
    const model::Pass pass{run.buffers, false, 0, 0};
    const int rank = tensor.rank();
    const std::size_t R = b.d.rows_mine();
    // column: x this rank's rows (R, H), y (N, Fm) its columns; row: x (N, Fm) its columns, y
    // its rows (R, H).
    const DeviceBuffer x = upload(ops, column ? rows_of(b, input(in, "x"), H, rank)
                                              : columns_of(input(in, "x"), N, Fm, rank));
    const DeviceBuffer dy = upload(ops, column ? columns_of(input(in, "dy"), N, Fm, rank)
                                               : rows_of(b, input(in, "dy"), H, rank));
    DeviceBuffer y(ops, N * Fm);
    Tensors out;
    const ConstPtr mine = linear.forward(ctx, pass, x.data(), y.data());
    out["y"] = column ? put_together(tensor, download(ops, mine, N * Fm), N)
                      : whole_rows(b, tensor, download(ops, mine, R * H));
    const ConstPtr dx = linear.backward(ctx, pass, x.data(), dy.data(), model::BackwardPart::both);
    out["dx"] = column ? whole_rows(b, tensor, download(ops, dx, R * H))
                       : put_together(tensor, download(ops, dx, N * Fm), N);
    const std::string prefix =
        b.layout.spec().layer_parts(0)[3].prefix + (column ? "c_fc" : "c_proj");
    add_grads(b, tensor, {prefix + ".weight", prefix + ".bias"}, out);
    return out;
}

std::vector<int32_t> ids(const std::vector<float>& values) {
    return std::vector<int32_t>(values.begin(), values.end());
}

// The embedding from "tokens" (N), its backward from "dy" (N, H).
Tensors run_embedding(kernels::Ops& ops, Bench& b, const Tensors& in, parallel::Comm& tensor) {
    const model::Embedding embedding(
        model::EmbeddingSpec{b.layout.wte(), b.layout.wpe(), b.layout.vocab_begin(), 0.0f}, b.d,
        b.set, b.scratch_spec);
    Run run(ops, b);
    model::PartContext ctx{ops, b.rows, b.alone, b.alone, b.weights, run.scratch};
    const model::Pass pass{run.buffers, false, 0, -1};
    const std::size_t H = static_cast<std::size_t>(b.d.H), R = b.d.rows_mine();
    const std::vector<int32_t> tokens = ids(input(in, "tokens"));
    DeviceBuffer out_rows(ops, R * H);
    const DeviceBuffer dy = upload(ops, rows_of(b, input(in, "dy"), H, tensor.rank()));
    embedding.forward(ctx, pass, tokens.data(), out_rows.data());
    Tensors out;
    out["y"] = whole_rows(b, tensor, download(ops, out_rows.data(), R * H));
    embedding.backward(ctx, pass, dy.data(), model::BackwardPart::both);
    std::vector<std::string> names;
    for (const model::TensorDecl& t : b.layout.spec().embedding_tensors()) names.push_back(t.name);
    add_grads(b, tensor, names, out);
    return out;
}

// The final norm, the LM head and the loss from "x" (N, H) against "targets" (N); the loss
// is each token's weighted 1/N (its mean).
Tensors run_head(kernels::Ops& ops, Bench& b, const Tensors& in, parallel::Comm& tensor) {
    const model::ModelSpec& spec = b.layout.spec();
    const model::LmHead head(
        model::LmHeadSpec{b.layout.head(), b.layout.vocab_begin(), b.layout.shape().vocab},
        spec.final_norm->build(b.build(b.layout.final_norm())), b.d, b.set, b.scratch_spec);
    Run run(ops, b);
    model::PartContext ctx{ops, b.rows, b.alone, b.alone, b.weights, run.scratch};
    const model::Pass pass{run.buffers, false, 0, 1};
    const std::size_t H = static_cast<std::size_t>(b.d.H), R = b.d.rows_mine();
    const DeviceBuffer x = upload(ops, rows_of(b, input(in, "x"), H, tensor.rank()));
    const std::vector<int32_t> targets = ids(input(in, "targets"));
    DeviceBuffer loss(ops, 1, kernels::DType::f64), dx(ops, R * H);
    head.forward(ctx, pass, x.data());
    head.loss(ctx, pass, targets.data(), static_cast<double*>(loss.data().data));
    double sum = 0;
    ops.download(&sum, loss.data().data, sizeof(sum));
    head.backward(ctx, pass, x.data(), 1.0f / static_cast<float>(b.d.N), dx.data(),
                  model::BackwardPart::both);
    head.finish_grads(ctx);
    Tensors out;
    out["loss"] = {static_cast<float>(sum)};
    out["dx"] = whole_rows(b, tensor, download(ops, dx.data(), R * H));
    std::vector<std::string> names;
    for (const model::TensorDecl& t : spec.head_tensors()) names.push_back(t.name);
    if (b.layout.shape().tied) names.push_back(b.layout.wte_name());
    add_grads(b, tensor, names, out);
    return out;
}

}  // namespace

Tensors run_part(kernels::Ops& ops, const PartCase& c, const Tensors& inputs,
                 parallel::Comm& tensor) {
    Bench b(ops, case_shape(c, tensor.size()), c, tensor);
    load(b, inputs);
    if (c.part.rfind("linear:", 0) == 0) return run_linear(ops, b, c, inputs, tensor);
    if (c.part == "embedding") return run_embedding(ops, b, inputs, tensor);
    if (c.part == "head") return run_head(ops, b, inputs, tensor);
    return run_layer_part(ops, b, c, inputs, tensor);
}

}  // namespace trident::test
