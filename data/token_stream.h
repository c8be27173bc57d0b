// A dataset is one token stream: whatever its files look like on disk (llm.c shards, a
// Megatron indexed dataset), the sampler sees N token ids in a fixed order and cuts windows
// from them (docs/ARCHITECTURE.md, "Sampling"). This is the seam between the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace trident::data {

class TokenStream {
public:
    virtual ~TokenStream() = default;

    // Tokens in the whole stream.
    virtual std::size_t size() const = 0;

    // Copies tokens [start, start + out.size()) into out; the range lies inside the stream.
    // Every id copied is checked against the vocabulary, as each batch is read: the files
    // are mapped, so one rewritten in place under the run (the same size, other bytes) shows
    // its new ids here, and an id outside the embedding would be read out of bounds. Throws
    // trident::Error naming the file, the byte and the id (token_changed).
    virtual void read(std::size_t start, std::span<int32_t> out) const = 0;

    // What was opened, for the start-up summary: "2 llm.c shards", "Megatron dataset P ...".
    virtual std::string describe() const = 0;

    // The files it reads, in a fixed order (a checkpoint records their fingerprints).
    virtual std::vector<std::string> files() const = 0;
};

// The error a read throws on an id outside the vocabulary: `what` the config key, `path` the
// file, `byte` where the id lies in it.
[[noreturn]] void token_changed(const std::string& what, const std::string& path, std::size_t byte,
                                int64_t id, int vocab_size);

}  // namespace trident::data
