// llm.c token shards: one file or a glob of files, read as one stream of token ids.
//
// Format (llm.c's dev/data/data_common.py): a header of 256 little-endian int32 — magic
// 20240520, version 1, number of tokens — then that many uint16 token ids. Every file is
// checked in full when opened (header, size, every id below the vocabulary), so bad data is
// reported up front with the file's name, never midway through a run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace trident::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderInts = 256;

class TokenShards {
public:
    // `pattern` is a path or a glob (files taken in name order); `what` names the config key
    // in messages (e.g. "data.train"). Throws trident::Error on any problem.
    TokenShards(const std::string& pattern, int vocab_size, const std::string& what);
    ~TokenShards();
    TokenShards(const TokenShards&) = delete;
    TokenShards& operator=(const TokenShards&) = delete;

    std::size_t size() const { return total_; }  // tokens in all files together
    const std::vector<std::string>& files() const { return paths_; }

    // Copies tokens [start, start + out.size()) of the stream into out, crossing files.
    void read(std::size_t start, std::span<int32_t> out) const;

private:
    struct Mapped {
        const uint16_t* tokens = nullptr;
        std::size_t count = 0;
        std::size_t first = 0;  // index of its first token in the stream
        void* base = nullptr;
        std::size_t bytes = 0;
    };

    std::vector<std::string> paths_;
    std::vector<Mapped> files_;
    std::size_t total_ = 0;
};

// Writes an llm.c shard (for tools and tests).
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace trident::data
