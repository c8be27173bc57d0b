// Where every GPT parameter lives in the flat parameter buffer.
//
// All parameters of the model sit in one contiguous fp32 buffer (and their gradients in
// another of the same layout), so the optimizer, the gradient norm and later the ZeRO-1
// sharding see one range. Tensors are named as in Hugging Face's GPT-2 (without the
// "transformer." prefix), but linear weights keep our [out, in] layout, and wte keeps the
// padded vocabulary rows (always zero).
//
// Order: wte, wpe, then layer by layer (so a pipeline stage owns a contiguous run), ln_f.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trident::model {

// The sizes that fix a GPT's parameters.
struct GptShape {
    int vocab = 0;         // V, real vocabulary
    int padded_vocab = 0;  // Vp >= V, multiple of 128
    int max_seq = 0;       // T, rows of wpe
    int layers = 0;        // L
    int hidden = 0;        // C
    int heads = 0;         // NH
    int ffn = 0;           // F, MLP width
};

struct ParamTensor {
    std::string name;             // e.g. "h.3.attn.c_attn.weight"
    std::vector<int64_t> shape;   // e.g. {3C, C}
    std::size_t offset = 0;       // in floats, into the flat buffer
    std::size_t numel = 0;
    bool decay = false;           // weight decay applies (matrices and embeddings)
};

// Offsets of one transformer block's tensors in the flat buffer.
struct LayerParams {
    std::size_t ln1_w, ln1_b;    // (C), (C)
    std::size_t qkv_w, qkv_b;    // (3C, C), (3C)
    std::size_t proj_w, proj_b;  // (C, C), (C)
    std::size_t ln2_w, ln2_b;    // (C), (C)
    std::size_t fc1_w, fc1_b;    // (F, C), (F)
    std::size_t fc2_w, fc2_b;    // (C, F), (C)
};

class ParamLayout {
public:
    explicit ParamLayout(const GptShape& shape);

    const GptShape& shape() const { return shape_; }
    const std::vector<ParamTensor>& tensors() const { return tensors_; }
    std::size_t total() const { return total_; }  // floats in the flat buffer

    std::size_t wte() const { return wte_; }    // (Vp, C)
    std::size_t wpe() const { return wpe_; }    // (T, C)
    std::size_t lnf_w() const { return lnf_w_; }  // (C)
    std::size_t lnf_b() const { return lnf_b_; }  // (C)
    const LayerParams& layer(int l) const { return layers_[static_cast<std::size_t>(l)]; }

    // The tensor of that name, or nullptr.
    const ParamTensor* find(const std::string& name) const;

private:
    std::size_t add(const std::string& name, std::vector<int64_t> shape, bool decay);

    GptShape shape_;
    std::vector<ParamTensor> tensors_;
    std::vector<LayerParams> layers_;
    std::size_t total_ = 0;
    std::size_t wte_ = 0, wpe_ = 0, lnf_w_ = 0, lnf_b_ = 0;
};

}  // namespace trident::model
