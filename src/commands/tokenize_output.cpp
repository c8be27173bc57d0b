// The outputs of `trident tokenize` (see tokenize_output.h).
#include "commands/tokenize_output.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "io/user_paths.h"
#include "kernels/error.h"

namespace trident::commands {

namespace {

namespace fs = std::filesystem;

// Whether `path` starts as an llm.c shard does: its magic and version.
bool is_llmc_shard(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    int32_t head[2] = {0, 0};
    in.read(reinterpret_cast<char*>(head), sizeof head);
    return in && head[0] == data::kShardMagic && head[1] == data::kShardVersion;
}

// A file of the other format where this one is about to write (`bin`, the .bin it writes) is
// someone's data, not an old output of this kind: refused rather than overwritten.
void refuse_other_format(const std::string& bin, const std::string& format) {
    io::refuse_special_file(bin, "--output");  // a FIFO would block the read of its start
    const std::string stem = bin.substr(0, bin.size() - 4);
    if (format == "megatron" && is_llmc_shard(bin))
        throw Error(bin + " is an llm.c token shard; --format megatron would overwrite it with " +
                    "the tokens of the Megatron dataset " + stem + " (" + stem + ".bin and " +
                    stem + ".idx): choose another --output or move it away");
    if (format == "llmc" && fs::exists(stem + ".idx") && !is_llmc_shard(bin) && fs::exists(bin))
        throw Error(bin + " holds the tokens of the Megatron dataset " + stem + " (" + stem +
                    ".idx beside it); an llm.c shard would overwrite it: choose another --output "
                    "or move them away");
}

}  // namespace

void frame_document(const data::Tokenizer& tokenizer, std::span<const int32_t> text_ids,
                    std::vector<int32_t>& out) {
    const std::span<const int32_t> start = tokenizer.document_start(),
                                   end = tokenizer.document_end();
    out.insert(out.end(), start.begin(), start.end());
    out.insert(out.end(), text_ids.begin(), text_ids.end());
    out.insert(out.end(), end.begin(), end.end());
    const std::optional<int32_t> eot = tokenizer.end_of_text();
    if (eot && (end.empty() || end.back() != *eot)) out.push_back(*eot);
}

TokenizedOutput::TokenizedOutput(const TokenizeOptions& opts, kernels::DType dtype)
    : opts_(opts), dtype_(dtype) {
    // Checked before anything is read or encoded, each of a Megatron output's two files: its
    // text, no device or FIFO in its place, its directory made and probed writable.
    const std::string bin = first_bin();
    io::check_output_file(bin, "--output");
    if (opts.format == "megatron") io::check_output_file(shard_name(".idx", 0), "--output");
    refuse_other_format(bin, opts.format);
}

std::string TokenizedOutput::first_bin() const {
    return opts_.format == "megatron" ? shard_name("", 0) + ".bin" : shard_name(".bin", 0);
}

TokenizedOutput::~TokenizedOutput() = default;

// OUT, or OUT_000000 ... with shards; for Megatron a prefix (a .bin/.idx suffix dropped).
std::string TokenizedOutput::shard_name(const std::string& ext, std::size_t shard) const {
    std::string stem = opts_.output;
    std::string suffix = ext;
    for (const std::string s : {".bin", ".idx"}) {
        if (stem.size() > s.size() && stem.compare(stem.size() - s.size(), s.size(), s) == 0) {
            stem.resize(stem.size() - s.size());
            if (opts_.format != "megatron") suffix = s;
        }
    }
    if (opts_.shard_tokens == 0) return stem + suffix;
    char index[16];
    std::snprintf(index, sizeof index, "_%06zu", shard);
    return stem + index + suffix;
}

void TokenizedOutput::add_document(std::span<const int32_t> ids) {
    tokens_ += ids.size();
    if (opts_.format == "megatron")
        add_megatron(ids);
    else
        add_llmc(ids);
}

// llm.c shards hold exactly --shard-tokens each (a document may go on in the next), as
// llm.c's own tokenizing scripts write them.
void TokenizedOutput::add_llmc(std::span<const int32_t> ids) {
    if (opts_.shard_tokens == 0 && tokens_ > data::kMaxShardTokens)
        throw Error(shard_name(".bin", 0) + ": more than " + std::to_string(data::kMaxShardTokens) +
                    " tokens, the most an llm.c shard holds (its header counts them in an "
                    "int32): give --shard-tokens (llm.c writes shards of 100000000)");
    narrow_.assign(ids.begin(), ids.end());
    std::span<const uint16_t> rest(narrow_);
    while (!rest.empty()) {
        if (!llmc_) {
            refuse_other_format(shard_name(".bin", shards_), opts_.format);
            llmc_ = std::make_unique<data::TokenShardWriter>(shard_name(".bin", shards_));
        }
        const std::size_t room =
            opts_.shard_tokens > 0 ? opts_.shard_tokens - shard_fill_ : rest.size();
        const std::size_t n = std::min(room, rest.size());
        llmc_->append(rest.first(n));
        shard_fill_ += n;
        rest = rest.subspan(n);
        if (opts_.shard_tokens > 0 && shard_fill_ == opts_.shard_tokens) close_llmc();
    }
}

// Megatron shards hold whole documents: one that would overflow the open shard starts the next.
void TokenizedOutput::add_megatron(std::span<const int32_t> ids) {
    if (megatron_ && opts_.shard_tokens > 0 && shard_fill_ > 0 &&
        shard_fill_ + ids.size() > opts_.shard_tokens)
        close_megatron();
    if (!megatron_) {
        refuse_other_format(shard_name("", shards_) + ".bin", opts_.format);
        megatron_ = std::make_unique<data::MegatronWriter>(shard_name("", shards_), dtype_);
    }
    megatron_->add_document(ids);
    shard_fill_ += ids.size();
}

void TokenizedOutput::close_llmc() {
    llmc_->close();
    closed_llmc_.push_back(std::move(llmc_));
    files_.push_back(shard_name(".bin", shards_++));
    shard_fill_ = 0;
}

void TokenizedOutput::close_megatron() {
    megatron_->close();
    closed_megatron_.push_back(std::move(megatron_));
    const std::string prefix = shard_name("", shards_++);
    files_.push_back(prefix + ".bin");
    files_.push_back(prefix + ".idx");
    shard_fill_ = 0;
}

std::vector<std::string> TokenizedOutput::commit() {
    if (megatron_) close_megatron();
    if (opts_.format != "megatron" && (llmc_ || files_.empty())) {
        if (!llmc_)  // no token at all: an empty shard, as asked
            llmc_ = std::make_unique<data::TokenShardWriter>(shard_name(".bin", shards_));
        close_llmc();
    }
    // In the order written (each Megatron shard's .bin before the .idx that describes it).
    for (const auto& shard : closed_llmc_) shard->commit();
    for (const auto& shard : closed_megatron_) shard->commit();
    warn_stale_shards();
    return files_;
}

// A shard numbered past this run's, left by an earlier run of more: a glob of the shards reads
// it too. Said, not removed (it is a file this run did not write).
void TokenizedOutput::warn_stale_shards() const {
    if (opts_.shard_tokens == 0) return;
    const std::string next =
        opts_.format == "megatron" ? shard_name("", shards_) + ".bin" : shard_name(".bin", shards_);
    if (fs::exists(next))
        std::fprintf(stderr,
                     "trident: warning: %s and any after it are from an earlier run, not this one "
                     "(it wrote %zu); a glob of the shards would read them too: remove them\n",
                     next.c_str(), shards_);
}

}  // namespace trident::commands
