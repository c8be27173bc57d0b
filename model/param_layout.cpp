// Builds the flat-buffer layout of model/param_layout.h.
#include "model/param_layout.h"

namespace trident::model {

ParamLayout::ParamLayout(const GptShape& shape) : shape_(shape) {
    const int64_t C = shape.hidden, F = shape.ffn;
    wte_ = add("wte.weight", {shape.padded_vocab, C}, true);
    wpe_ = add("wpe.weight", {shape.max_seq, C}, true);
    for (int l = 0; l < shape.layers; ++l) {
        const std::string p = "h." + std::to_string(l) + ".";
        LayerParams lp{};
        lp.ln1_w = add(p + "ln_1.weight", {C}, false);
        lp.ln1_b = add(p + "ln_1.bias", {C}, false);
        lp.qkv_w = add(p + "attn.c_attn.weight", {3 * C, C}, true);
        lp.qkv_b = add(p + "attn.c_attn.bias", {3 * C}, false);
        lp.proj_w = add(p + "attn.c_proj.weight", {C, C}, true);
        lp.proj_b = add(p + "attn.c_proj.bias", {C}, false);
        lp.ln2_w = add(p + "ln_2.weight", {C}, false);
        lp.ln2_b = add(p + "ln_2.bias", {C}, false);
        lp.fc1_w = add(p + "mlp.c_fc.weight", {F, C}, true);
        lp.fc1_b = add(p + "mlp.c_fc.bias", {F}, false);
        lp.fc2_w = add(p + "mlp.c_proj.weight", {C, F}, true);
        lp.fc2_b = add(p + "mlp.c_proj.bias", {C}, false);
        layers_.push_back(lp);
    }
    lnf_w_ = add("ln_f.weight", {C}, false);
    lnf_b_ = add("ln_f.bias", {C}, false);
}

std::size_t ParamLayout::add(const std::string& name, std::vector<int64_t> shape, bool decay) {
    std::size_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<std::size_t>(d);
    tensors_.push_back(ParamTensor{name, std::move(shape), total_, numel, decay});
    total_ += numel;
    return tensors_.back().offset;
}

const ParamTensor* ParamLayout::find(const std::string& name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

}  // namespace trident::model
