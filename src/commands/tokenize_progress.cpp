// `trident tokenize`'s progress line (see tokenize_progress.h).
#include "commands/tokenize_progress.h"

#include <unistd.h>

#include <cstdio>

#include "train/metrics.h"

namespace trident::commands {

std::string megabytes(uint64_t bytes) {
    char buf[32];
    if (bytes >= 1'000'000'000)
        std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / 1e9);
    else
        std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
    return buf;
}

TokenizeProgress::TokenizeProgress(bool shown)
    : shown_(shown),
      terminal_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {
    if (!terminal_) last_ = 0;  // a log's first line after kPlainSeconds: short runs show the last
}

double TokenizeProgress::seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void TokenizeProgress::update(const TokenizeCounts& counts) {
    if (!shown_ || seconds() - last_ < (terminal_ ? 0.2 : kPlainSeconds)) return;
    draw(counts);
}

void TokenizeProgress::finish(const TokenizeCounts& counts) {
    if (!shown_) return;
    draw(counts);
    if (terminal_) std::fprintf(stderr, "\n");
}

// "tokenize: 42.0% of 1.20 GB | 96.3 MB/s | 12345 documents | 5.61 M tokens | ETA 1m05s"
void TokenizeProgress::draw(const TokenizeCounts& counts) {
    const double now = seconds();
    last_ = now;
    const double fraction =
        counts.total > 0 ? static_cast<double>(counts.done) / static_cast<double>(counts.total) : 1;
    const double rate = now > 0 ? static_cast<double>(counts.text) / 1e6 / now : 0;
    const double left = fraction > 0 ? now / fraction - now : 0;
    std::fprintf(stderr, "%stokenize: %5.1f%% of %s | %.1f MB/s | %s | %s tokens | ETA %s%s",
                 terminal_ ? "\r" : "", 100 * fraction, megabytes(counts.total).c_str(), rate,
                 train::counted(static_cast<int64_t>(counts.documents), "document").c_str(),
                 train::human_count(static_cast<double>(counts.tokens)).c_str(),
                 train::human_duration(left).c_str(), terminal_ ? "   " : "\n");
    std::fflush(stderr);
}

}  // namespace trident::commands
