// `trident tokenize`: turns text files into an llm.c token shard.
//
// The byte-level tokenizer maps each byte of the text to its own id (vocabulary 256); files
// are concatenated in the order given.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

#include "commands/commands.h"
#include "data/token_shards.h"
#include "error.h"

namespace trident::commands {

int tokenize(const TokenizeOptions& opts) {
    if (opts.tokenizer != "bytes")
        throw Error("--tokenizer: unknown tokenizer '" + opts.tokenizer + "' (available: bytes)");
    std::vector<uint16_t> tokens;
    for (const std::string& path : opts.inputs) {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw Error("cannot open '" + path + "'");
        const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
        for (char c : bytes) tokens.push_back(static_cast<unsigned char>(c));
    }
    if (tokens.size() > static_cast<std::size_t>(INT32_MAX))
        throw Error("more than 2^31 tokens: an llm.c shard's header cannot count them");
    data::write_token_shard(opts.output, tokens);
    std::printf("wrote %zu tokens to %s\n", tokens.size(), opts.output.c_str());
    return 0;
}

}  // namespace trident::commands
