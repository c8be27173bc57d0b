// `trident tokenize` of JSON-lines corpora (FineWeb's and FineWeb-Edu's exports, Dolma, the
// Pile, RedPajama, OpenWebText dumps): .jsonl, .json and .ndjson files, plain or compressed
// (.gz, .zst: data/byte_source.h), each line one document whose text is the string of --field.
//
// Streaming, in parallel: reader threads take the files in turn and cut each into blocks of
// whole lines; every thread encodes blocks as they come, so a large file is encoded by all of
// them and many small ones are read at once; the documents are written in the input's order
// (file by file, line by line), whatever thread encoded them. At most a fixed number of blocks
// per thread is in flight (read and not yet written), so memory follows the thread count, not
// the corpus: readers wait for the writer, and the file it is writing always gets a block.
//
// A line that is not a JSON object with a string at --field is malformed: reported with its
// file and line, counted and skipped, and beyond --max-bad-lines (default 0) it stops the run.
// Blank lines are skipped; a document of empty text is left out (no end of text alone).
#pragma once

#include <string>
#include <vector>

#include "commands/commands.h"
#include "commands/tokenize_output.h"
#include "commands/tokenize_progress.h"
#include "data/tokenizer.h"

namespace trident::commands {

// Whether `path` is read as JSON lines: named .jsonl, .json or .ndjson, perhaps then .gz or .zst.
bool is_json_lines(const std::string& path);

// What the run met beyond its documents.
struct JsonlCounts {
    TokenizeCounts counts;
    uint64_t empty = 0;      // documents of empty text, left out
    uint64_t malformed = 0;  // lines skipped (at most --max-bad-lines)
};

// Tokenizes `files`, in order, into `output` on opts.threads threads (a count already bounded:
// kernels/threads.h). Throws trident::Error at the first malformed line past --max-bad-lines,
// naming its file and line, and on a file that cannot be read or decompressed.
JsonlCounts tokenize_json_lines(const TokenizeOptions& opts, const std::vector<std::string>& files,
                                const data::Tokenizer& tokenizer, TokenizedOutput& output,
                                TokenizeProgress& progress);

}  // namespace trident::commands
