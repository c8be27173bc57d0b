// The progress of `trident tokenize` on stderr, and its summary. On a terminal one line is
// redrawn in place (a carriage return before each); anywhere else (a log file, a pipe, a batch
// job's output) a plain line every kPlainSeconds and one at the end, so that a log holds lines,
// not frames.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace trident::commands {

// What a run has done so far.
struct TokenizeCounts {
    uint64_t done = 0, total = 0;  // of the input's bytes on disk (compressed, if it is)
    uint64_t text = 0;             // bytes of text read (decompressed)
    uint64_t documents = 0, tokens = 0;
};

class TokenizeProgress {
public:
    static constexpr double kPlainSeconds = 10;

    // `shown`: false for --no-progress. Counts time from here.
    explicit TokenizeProgress(bool shown);
    double seconds() const;
    // At most every 0.2 s on a terminal, every kPlainSeconds elsewhere.
    void update(const TokenizeCounts& counts);
    // The last line (100%), then a newline on a terminal.
    void finish(const TokenizeCounts& counts);

private:
    void draw(const TokenizeCounts& counts);

    bool shown_, terminal_;
    std::chrono::steady_clock::time_point start_;
    double last_ = -1e9;  // seconds() of the last line drawn (a terminal's first is at once)
};

// "12.3 MB", "4.56 GB": decimal units, as throughput and file sizes are quoted.
std::string megabytes(uint64_t bytes);

}  // namespace trident::commands
