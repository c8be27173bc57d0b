// llm.c token shards: one file or a glob of files, read as one stream of token ids.
//
// Format (llm.c's dev/data/data_common.py): a header of 256 little-endian int32 — magic
// 20240520, version 1, number of tokens — then that many uint16 token ids. Every file is
// checked in full when opened (header, size, every id below the vocabulary), so bad data is
// reported up front with the file's name; the ids read are checked again as they are read
// (token_stream.h), for a file rewritten under the run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/token_stream.h"
#include "io/output_file.h"

namespace trident::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderInts = 256;

class TokenShards : public TokenStream {
public:
    // `pattern` is a path or a glob (files taken in name order); `what` names the config key
    // in messages (e.g. "data.train"). Throws trident::Error on any problem.
    TokenShards(const std::string& pattern, int vocab_size, const std::string& what);
    TokenShards(const TokenShards&) = delete;
    TokenShards& operator=(const TokenShards&) = delete;

    std::size_t size() const override { return total_; }  // tokens in all files together
    std::vector<std::string> files() const override { return paths_; }

    // Copies tokens [start, start + out.size()) of the stream into out, crossing files.
    void read(std::size_t start, std::span<int32_t> out) const override;
    std::string describe() const override;

private:
    struct Shard {
        MappedFile file;
        const uint16_t* tokens = nullptr;
        std::size_t count = 0;
        std::size_t first = 0;  // index of its first token in the stream
    };

    std::vector<std::string> paths_;
    std::vector<Shard> files_;
    std::size_t total_ = 0;
    int vocab_size_;
    std::string what_;
};

// The most tokens an llm.c shard holds: its header counts them in an int32.
inline constexpr std::size_t kMaxShardTokens = 2147483647;

// Writes an llm.c shard as its tokens come, in bounded memory: the header (its count zero) first,
// the tokens after it, then the count filled in. The file appears under its name only when
// finish() succeeds (io::ReplacingFile): an abandoned one is removed.
class TokenShardWriter {
public:
    explicit TokenShardWriter(const std::string& path);
    // Throws trident::Error naming the file past kMaxShardTokens.
    void append(std::span<const uint16_t> tokens);
    void close();   // the count filled in, the file closed but not yet under its name
    void commit();  // under its name (closed first, unless it was)
    void finish() { commit(); }
    std::size_t tokens() const { return tokens_; }

private:
    std::string path_;
    io::ReplacingFile file_;
    std::size_t tokens_ = 0;
    bool closed_ = false;
};

// Writes an llm.c shard whole (for tools and tests).
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace trident::data
