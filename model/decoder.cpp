// Incremental decoding over a key/value cache (see decoder.h).
#include "model/decoder.h"

#include <numeric>
#include <string>

#include "kernels/error.h"

namespace trident::model {

// The stage's parts built for passes of T rows, their scratch and activations.
struct Decoder::Parts {
    Dims d;
    TensorRows rows;
    StageParts parts;
    Scratch scratch;
    PartContext ctx;
    ActivationStore store;

    Parts(kernels::Ops& ops, const ParamLayout& layout, const ModelGroups& groups, Weights& weights,
          KvCache& cache, const Dims& dims)
        : d(dims),
          rows(ops, groups.tensor, d, std::vector<int32_t>(static_cast<std::size_t>(d.T), 0)),
          parts(build_stage(layout, ParamLayout::for_lora(layout.shape(), LoraShape{}), d,
                            PartOptions{0, {}, {}, cached_cores(cache)})),
          scratch(ops, parts.scratch.buffers()),
          ctx{ops, rows, groups.context, groups.kv_replicas, weights, scratch},
          store(ops, KeepPolicy{}, parts.chunks) {}
};

namespace {

// The sizes of a pass of T rows of one sequence.
Dims pass_dims(const GptShape& shape, int T) {
    Dims d = make_dims(shape, DimsInputs{});
    d.T = d.N = d.R = T;
    return d;
}

}  // namespace

Decoder::Decoder(kernels::Ops& ops, const GptShape& shape, const ModelGroups& groups,
                 const std::vector<float>& params)
    : ops_(ops), groups_(groups), layout_(shape), cache_(ops, shape) {
    if (groups.tensor.size() != 1 || groups.context.size() != 1)
        throw Error("generation runs on one process (parallel.tensor = context = 1)");
    weights_.params = FlatBuffer(ops, layout_.total(), kernels::DType::f32);
    weights_.params.from_host(params);
    one_ = std::make_unique<Parts>(ops, layout_, groups, weights_, cache_, pass_dims(shape, 1));
}

Decoder::~Decoder() = default;

std::vector<float> Decoder::prefill(const std::vector<int32_t>& tokens) {
    const int T = shape().max_seq;
    if (tokens.empty() || tokens.size() > static_cast<std::size_t>(T))
        throw Error("internal: a prefill of " + std::to_string(tokens.size()) +
                    " tokens for a sequence length of " + std::to_string(T));
    cache_.reset();
    const int n = static_cast<int>(tokens.size());
    // The parts of a pass as wide as the prompt, kept for the next prompt of that width.
    if (!prompt_ || prompt_->d.T != n)
        prompt_ = std::make_unique<Parts>(ops_, layout_, groups_, weights_, cache_,
                                          pass_dims(shape(), n));
    return run(*prompt_, tokens.data());
}

std::vector<float> Decoder::step(int32_t token) {
    if (length() >= cache_.capacity())
        throw Error("internal: a step past the key/value cache's " +
                    std::to_string(cache_.capacity()) + " positions");
    return run(*one_, &token);
}

std::vector<float> Decoder::run(Parts& p, const int32_t* tokens) {
    const int count = p.d.T;
    const GptShape& s = shape();
    if (p.parts.positions >= 0) {  // T < seq_len: positions length() .. length() + T - 1
        std::vector<int32_t> positions(static_cast<std::size_t>(count));
        std::iota(positions.begin(), positions.end(), length());
        ops_.upload(p.scratch[p.parts.positions].data, positions.data(),
                    positions.size() * sizeof(int32_t));
    }
    ActivationStore::Set& set = p.store.start(0, 0);
    const SetBuffers own = p.store.own(set);
    const Pass own_pass{own, false, 0, -1};
    const kernels::Ptr x = own[p.parts.chunk_input[0]];
    p.parts.embedding->forward(p.ctx, own_pass, tokens, x);
    kernels::ConstPtr input = x;
    for (int l = 0; l < s.layers; ++l) {
        const SetBuffers buffers = p.store.layer(set, 0, l);
        const Pass pass{buffers, false, 0, l};
        const TransformerLayer& layer = p.parts.layer(0, l);
        layer.forward(p.ctx, pass, input, layer.output(pass));
        input = layer.output(pass);
    }
    p.parts.head->forward(p.ctx, own_pass, input);
    cache_.advance(count);
    std::vector<float> row(static_cast<std::size_t>(s.vocab));  // padded columns dropped
    ops_.copy_to_host(row.data(),
                      p.parts.head->logits(own_pass) + static_cast<std::size_t>(count - 1) *
                                                           static_cast<std::size_t>(s.padded_vocab),
                      row.size());
    p.store.release(0, 0);
    return row;
}

}  // namespace trident::model
