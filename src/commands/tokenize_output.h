// What `trident tokenize` writes: documents' ids as an llm.c token shard or a Megatron dataset,
// one output or shards of --shard-tokens (OUT_000000.bin, ...), each document framed by the
// tokenizer's document start and end and its end-of-text id.
//
// Every file is written under a temporary name beside its own (io::ReplacingFile) and the
// shards are renamed into place together only when the whole run succeeds: a run that stops (a
// malformed line, a full disk, an error of any kind) leaves none of its files, and an earlier
// dataset of the same name stays whole until the new one replaces it. Memory is the open
// shard's (a Megatron one keeps a length per document), never the whole output's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "commands/commands.h"
#include "data/megatron_dataset.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "kernels/dtype.h"

namespace trident::commands {

// Appends one document's ids as they are written: the tokenizer's document start, `text_ids`,
// its document end, then its end of text unless the document end already is that.
void frame_document(const data::Tokenizer& tokenizer, std::span<const int32_t> text_ids,
                    std::vector<int32_t>& out);

class TokenizedOutput {
public:
    // `dtype`: the Megatron dataset's ids (u16, or i32 for a vocabulary beyond 16 bits). Checks
    // the first output at once (io::check_output_file, which makes its directory) and refuses
    // an output name that holds the other format's data.
    TokenizedOutput(const TokenizeOptions& opts, kernels::DType dtype);
    ~TokenizedOutput();  // removes the temporary files unless commit() ran
    TokenizedOutput(const TokenizedOutput&) = delete;
    TokenizedOutput& operator=(const TokenizedOutput&) = delete;

    // One framed document (frame_document).
    void add_document(std::span<const int32_t> ids);
    // Writes what is left and moves every file into place, in order; returns their names.
    std::vector<std::string> commit();
    std::size_t tokens() const { return tokens_; }
    // The first output's .bin (OUT.bin, OUT_000000.bin, a Megatron prefix's .bin).
    std::string first_bin() const;

private:
    std::string shard_name(const std::string& ext, std::size_t shard) const;
    void add_llmc(std::span<const int32_t> ids);
    void add_megatron(std::span<const int32_t> ids);
    void close_llmc();
    void close_megatron();
    void warn_stale_shards() const;

    const TokenizeOptions& opts_;
    kernels::DType dtype_;
    std::vector<std::string> files_;                // the names of the closed shards' files
    std::unique_ptr<data::TokenShardWriter> llmc_;  // the open shard, one format or the other
    std::unique_ptr<data::MegatronWriter> megatron_;
    // Closed shards, to be renamed into place by commit().
    std::vector<std::unique_ptr<data::TokenShardWriter>> closed_llmc_;
    std::vector<std::unique_ptr<data::MegatronWriter>> closed_megatron_;
    std::vector<uint16_t> narrow_;  // llm.c: a document's ids as uint16
    std::size_t shard_fill_ = 0;    // tokens in the open shard
    std::size_t shards_ = 0;        // outputs closed (a Megatron one is two files)
    std::size_t tokens_ = 0;
};

}  // namespace trident::commands
