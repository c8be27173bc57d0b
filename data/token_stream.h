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
    virtual void read(std::size_t start, std::span<int32_t> out) const = 0;

    // What was opened, for the start-up summary: "2 llm.c shards", "Megatron dataset P ...".
    virtual std::string describe() const = 0;

    // The files it reads, in a fixed order (a checkpoint records their fingerprints).
    virtual std::vector<std::string> files() const = 0;
};

}  // namespace trident::data
