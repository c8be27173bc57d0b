// Reading and writing llm.c token shards (see token_shards.h).
#include "data/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "io/output_file.h"
#include "kernels/error.h"

namespace trident::data {

namespace {

std::vector<std::string> expand(const std::string& pattern, const std::string& what) {
    glob_t g{};
    const int rc = glob(pattern.c_str(), GLOB_NOSORT, nullptr, &g);
    std::vector<std::string> paths;
    if (rc == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    if (paths.empty())
        throw Error(what + ": no file matches '" + pattern +
                    "' (prepare the data first, or point " + what + " at an llm.c token shard)");
    std::sort(paths.begin(), paths.end());
    return paths;
}

}  // namespace

TokenShards::TokenShards(const std::string& pattern, int vocab_size, const std::string& what)
    : paths_(expand(pattern, what)), vocab_size_(vocab_size), what_(what) {
    for (const std::string& path : paths_) {
        MappedFile file(path, what);
        const std::size_t bytes = file.bytes();
        const std::size_t header_bytes = kShardHeaderInts * sizeof(int32_t);
        if (bytes < header_bytes)
            throw Error(path + ": " + std::to_string(bytes) + " bytes is shorter than the " +
                        std::to_string(header_bytes) + "-byte llm.c shard header (truncated?)");
        const unsigned char* base = file.data();

        int32_t header[kShardHeaderInts];
        std::memcpy(header, base, header_bytes);
        if (header[0] != kShardMagic)
            throw Error(path + ": not an llm.c token shard (magic " + std::to_string(header[0]) +
                        ", expected " + std::to_string(kShardMagic) + ")");
        if (header[1] != kShardVersion)
            throw Error(path + ": unsupported llm.c shard version " + std::to_string(header[1]) +
                        " (expected 1: uint16 tokens)");
        if (header[2] < 0) throw Error(path + ": negative token count in header");
        const std::size_t count = static_cast<std::size_t>(header[2]);
        const std::size_t expected = header_bytes + count * sizeof(uint16_t);
        if (bytes != expected)
            throw Error(path + ": header says " + std::to_string(count) + " tokens (" +
                        std::to_string(expected) + " bytes) but the file has " +
                        std::to_string(bytes) + " bytes: truncated or corrupt");
        const auto* tokens = reinterpret_cast<const uint16_t*>(base + header_bytes);
        for (std::size_t i = 0; i < count; ++i)
            if (tokens[i] >= vocab_size)
                throw Error(path + ": token id " + std::to_string(tokens[i]) + " at position " +
                            std::to_string(i) + " is outside the vocabulary (model.vocab_size = " +
                            std::to_string(vocab_size) + ")");
        files_.push_back(Shard{std::move(file), tokens, count, total_});
        total_ += count;
    }
}

void TokenShards::read(std::size_t start, std::span<int32_t> out) const {
    // The file holding `start`: the last whose first token is at or before it.
    auto it = std::upper_bound(files_.begin(), files_.end(), start,
                               [](std::size_t s, const Shard& m) { return s < m.first; });
    std::size_t file = static_cast<std::size_t>(it - files_.begin()) - 1;
    std::size_t pos = start - files_[file].first;
    const auto vocab = static_cast<uint16_t>(std::min(vocab_size_, 65536) - 1);  // the largest id
    for (int32_t& t : out) {
        while (pos >= files_[file].count) {
            ++file;
            pos = 0;
        }
        const uint16_t id = files_[file].tokens[pos++];
        if (id > vocab)
            token_changed(what_, paths_[file], kShardHeaderInts * sizeof(int32_t) + 2 * (pos - 1),
                          id, vocab_size_);
        t = id;
    }
}

std::string TokenShards::describe() const {
    if (paths_.size() == 1) return "llm.c shard " + paths_[0];
    return std::to_string(paths_.size()) + " llm.c shards " + paths_.front() + " ... " +
           paths_.back();
}

TokenShardWriter::TokenShardWriter(const std::string& path) : path_(path), file_(path) {
    const int32_t header[kShardHeaderInts] = {kShardMagic, kShardVersion, 0};
    file_.write(header, sizeof header);
}

void TokenShardWriter::append(std::span<const uint16_t> tokens) {
    if (tokens.size() > kMaxShardTokens - tokens_)
        throw Error(path_ + ": an llm.c shard holds at most " + std::to_string(kMaxShardTokens) +
                    " tokens (its header counts them in an int32): write shards of fewer "
                    "(tokenize --shard-tokens)");
    file_.write(tokens.data(), tokens.size_bytes());
    tokens_ += tokens.size();
}

void TokenShardWriter::close() {
    if (closed_) return;
    const int32_t count = static_cast<int32_t>(tokens_);
    file_.write_at(2 * sizeof(int32_t), &count, sizeof count);
    file_.close();
    closed_ = true;
}

void TokenShardWriter::commit() {
    close();
    file_.commit();
}

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
    TokenShardWriter out(path);
    out.append(tokens);
    out.finish();
}

}  // namespace trident::data
