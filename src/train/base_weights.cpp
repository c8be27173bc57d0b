// The weights a run starts from and their identity (see base_weights.h).
#include "train/base_weights.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "config/model_shape.h"
#include "io/output_file.h"
#include "io/sha256.h"
#include "kernels/error.h"
#include "model/hf_gpt2.h"
#include "model/hf_llama.h"
#include "model/hf_weights.h"
#include "train/checkpoint.h"

namespace trident::train {

namespace fs = std::filesystem;

namespace {

// A Hugging Face model folder rather than a checkpoint: config.json says what it holds.
bool is_hf_folder(const std::string& path) {
    return fs::is_directory(path) && fs::exists(fs::path(path) / "config.json");
}

// A GPT-2 folder's one weights file (GPT-2 folders are read unsharded); a file as it is.
std::string hf_gpt2_weights(const std::string& from) {
    return is_hf_folder(from) ? (fs::path(from) / model::kHfWeightsName).string() : from;
}

}  // namespace

std::string load_base_weights(const std::string& from, const model::ParamLayout& whole,
                              float* params) {
    if (!fs::is_directory(from) || is_hf_folder(from)) {
        if (whole.shape().arch == model::Arch::llama)
            model::load_hf_llama(from, whole, params);  // a file or a folder
        else
            model::load_hf_gpt2(hf_gpt2_weights(from), whole, params);
        return from;
    }
    const LoadedModel loaded = load_model_checkpoint(from);
    const model::GptShape theirs = gpt_shape(loaded.cfg), &ours = whole.shape();
    if (theirs.vocab != ours.vocab || theirs.max_seq != ours.max_seq ||
        theirs.layers != ours.layers || theirs.hidden != ours.hidden ||
        theirs.heads != ours.heads || theirs.ffn != ours.ffn || theirs.kv_heads != ours.kv_heads ||
        theirs.tied != ours.tied ||
        !model::resolve_spec(theirs).same_parts(model::resolve_spec(ours)))
        throw Error(loaded.path + ": the checkpoint's model (vocab " +
                    std::to_string(theirs.vocab) + ", seq " + std::to_string(theirs.max_seq) +
                    ", layers " + std::to_string(theirs.layers) + ", hidden " +
                    std::to_string(theirs.hidden) + ", heads " + std::to_string(theirs.heads) +
                    ") is not the config's");
    // Tensor by tensor: only the padded vocabulary may differ, in wte's trailing zero rows.
    const model::ParamLayout their_layout(theirs);
    for (const model::ParamTensor& t : whole.tensors()) {
        const model::ParamTensor* src = their_layout.find(t.name);
        if (!src) throw Error(loaded.path + ": no tensor " + t.name);
        const std::size_t n = std::min(t.numel, src->numel);
        std::copy_n(loaded.params.data() + src->offset, n, params + t.offset);
    }
    return loaded.path;
}

std::string base_weights_sha256(const std::string& read) {
    if (!is_hf_folder(read))
        return io::sha256_file(fs::is_directory(read) ? (fs::path(read) / kManifestName).string()
                                                      : read);
    // A Hugging Face folder: the digest of its weights' and configs' digests, in name order.
    std::vector<std::string> files;
    for (const fs::directory_entry& e : fs::directory_iterator(read)) {
        const std::string ext = e.path().extension().string();
        if (e.is_regular_file() && (ext == ".safetensors" || ext == ".json"))
            files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    std::string digests;
    for (const std::string& f : files)
        digests += fs::path(f).filename().string() + " " + io::sha256_file(f) + "\n";
    return io::sha256_hex(digests);
}

std::string base_relative_to(const std::string& base, const std::string& checkpoint_dir) {
    return fs::absolute(base)
        .lexically_normal()
        .lexically_relative(fs::absolute(checkpoint_dir).lexically_normal())
        .string();
}

std::string resolve_base(const std::string& recorded, const std::string& checkpoint_dir) {
    const fs::path p(recorded);
    return p.is_absolute() ? recorded : (fs::path(checkpoint_dir) / p).lexically_normal().string();
}

std::vector<std::string> pinned_by(const std::string& checkpoint) {
    std::vector<std::string> runs;
    std::ifstream in(fs::path(checkpoint) / kPinName);
    for (std::string line; std::getline(in, line);)
        if (!line.empty()) runs.push_back(line);
    return runs;
}

void pin_base(const std::string& checkpoint, const std::string& run) {
    std::vector<std::string> runs = pinned_by(checkpoint);
    const std::string me = fs::absolute(run).lexically_normal().string();
    if (std::find(runs.begin(), runs.end(), me) != runs.end()) return;
    runs.push_back(me);
    std::string text;
    for (const std::string& r : runs) text += r + "\n";
    io::write_file_atomically((fs::path(checkpoint) / kPinName).string(), text);
}

}  // namespace trident::train
