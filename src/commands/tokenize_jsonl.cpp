// JSON-lines corpora read, encoded and written in parallel (see tokenize_jsonl.h).
#include "commands/tokenize_jsonl.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "data/byte_source.h"
#include "io/json_reader.h"
#include "kernels/error.h"

namespace trident::commands {

namespace {

// A block is about this much text; a longer line makes a longer block, up to the longest line.
constexpr std::size_t kBlockBytes = std::size_t{1} << 20;
constexpr std::size_t kMaxLineBytes = std::size_t{128} << 20;
constexpr std::size_t kShownMalformed = 10;  // malformed lines printed; the rest are counted

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Whole lines of one file.
struct Block {
    std::size_t file = 0, index = 0;  // the file, and the block's place in it
    bool last = false;                // the file's last block
    std::string bytes;
    uint64_t disk = 0;  // bytes of the file consumed for it (compressed, if the file is)
};

// A block's documents, framed and back to back, and its malformed lines.
struct Encoded {
    std::vector<int32_t> ids;
    std::vector<std::size_t> ends;  // where each document ends in `ids`
    struct Malformed {
        uint64_t line;  // within the block, from 0
        std::string what;
    };
    std::vector<Malformed> malformed;
    uint64_t lines = 0, empty = 0, text = 0, disk = 0;
    bool last = false;
};

// The documents of one block (see the file comment of tokenize_jsonl.h).
Encoded encode_block(const Block& block, const std::string& field,
                     const data::Tokenizer& tokenizer) {
    Encoded out;
    out.last = block.last;
    out.disk = block.disk;
    out.text = block.bytes.size();
    std::string text;
    std::vector<int32_t> ids;
    std::string_view rest = block.bytes;
    for (; !rest.empty(); ++out.lines) {
        const std::size_t end = std::min(rest.find('\n'), rest.size());
        const std::string_view line = rest.substr(0, end);
        rest.remove_prefix(std::min(end + 1, rest.size()));
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        text.clear();
        try {
            io::json::string_member(line, field, text);
        } catch (const Error& e) {
            out.malformed.push_back({out.lines, e.what()});
            continue;
        }
        if (text.empty()) {
            ++out.empty;
            continue;
        }
        ids.clear();
        tokenizer.encode(text, ids);
        frame_document(tokenizer, ids, out.ids);
        out.ends.push_back(out.ids.size());
    }
    return out;
}

// Cuts one file into blocks of whole lines.
class LineBlocks {
public:
    explicit LineBlocks(const std::string& path)
        : path_(path), source_(data::open_byte_source(path)) {}

    // The next block; its `last` is set at the file's end.
    Block next() {
        Block block;
        block.bytes = std::move(carry_);
        std::size_t cut = std::string::npos;  // the last newline read
        bool end = false;
        while (!end && (block.bytes.size() < kBlockBytes || cut == std::string::npos)) {
            const std::size_t line = cut == std::string::npos ? 0 : cut + 1;
            if (block.bytes.size() - line > kMaxLineBytes) too_long(block.bytes.substr(0, line));
            const std::size_t had = block.bytes.size();
            block.bytes.resize(had + kBlockBytes);
            const std::size_t got = source_->read(std::span(block.bytes).subspan(had));
            block.bytes.resize(had + got);
            end = got == 0;
            // Only what was just read is searched: a long line is not searched again and again.
            const std::size_t found = std::string_view(block.bytes).substr(had).rfind('\n');
            if (found != std::string_view::npos) cut = had + found;
        }
        if (!end) {
            carry_.assign(block.bytes, cut + 1);
            block.bytes.resize(cut + 1);
        }
        lines_ += static_cast<uint64_t>(std::count(block.bytes.begin(), block.bytes.end(), '\n'));
        block.last = end;
        block.disk = source_->consumed() - consumed_;
        consumed_ = source_->consumed();
        return block;
    }

private:
    // A line that does not end within kMaxLineBytes: not a corpus of one document a line.
    [[noreturn]] void too_long(std::string_view before) const {
        const auto line =
            lines_ + static_cast<uint64_t>(std::count(before.begin(), before.end(), '\n')) + 1;
        throw Error(path_ + ":" + std::to_string(line) + ": a line of more than " +
                    std::to_string(kMaxLineBytes >> 20) +
                    " MiB: is it JSON lines (one document a line)?");
    }

    std::string path_;
    std::unique_ptr<data::ByteSource> source_;
    std::string carry_;  // the start of the next block's first line
    uint64_t lines_ = 0, consumed_ = 0;
};

// The run: readers, encoders and the writer (the calling thread), sharing one lock.
class JsonlRun {
public:
    JsonlRun(const TokenizeOptions& opts, const std::vector<std::string>& files,
             const data::Tokenizer& tokenizer)
        : opts_(opts), files_(files), tokenizer_(tokenizer) {
        encoders_ = std::max(1, opts.threads);  // bounded by tokenize() (kernels/threads.h)
        readers_ = std::clamp<int>(encoders_ / 4, 1, static_cast<int>(files.size()));
        // Two blocks per encoder (one encoded, one waiting) and two per reader.
        budget_ = 2 * (encoders_ + readers_);
    }
    ~JsonlRun() { stop(); }

    JsonlCounts run(TokenizedOutput& output, TokenizeProgress& progress);

private:
    void start();
    void stop();
    void fail(std::exception_ptr failure);
    void read_files();
    void encode_blocks();
    Encoded wait_for(std::size_t file, std::size_t index, TokenizeProgress& progress);
    void write(const Encoded& block, std::size_t file, TokenizedOutput& output);

    const TokenizeOptions& opts_;
    const std::vector<std::string>& files_;
    const data::Tokenizer& tokenizer_;
    int encoders_ = 1, readers_ = 1, budget_ = 1;
    std::vector<std::thread> threads_;

    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<Block> queue_;                                      // read, to encode
    std::map<std::pair<std::size_t, std::size_t>, Encoded> done_;  // encoded, to write
    std::size_t next_file_ = 0, head_file_ = 0;  // the next file to read; the file being written
    int in_flight_ = 0, reading_ = 0;            // blocks read not yet written; readers running
    bool stopping_ = false;
    std::exception_ptr failure_;

    JsonlCounts counts_;
    uint64_t lines_before_ = 0;  // lines of the blocks of this file written so far
};

void JsonlRun::start() {
    reading_ = readers_;
    for (int r = 0; r < readers_; ++r) threads_.emplace_back([this] { read_files(); });
    for (int e = 0; e < encoders_; ++e) threads_.emplace_back([this] { encode_blocks(); });
}

void JsonlRun::stop() {
    {
        const std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    changed_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
}

void JsonlRun::fail(std::exception_ptr failure) {
    {
        const std::lock_guard lock(mutex_);
        if (!failure_) failure_ = failure;
        stopping_ = true;
    }
    changed_.notify_all();
}

// A reader takes the next file not taken and queues its blocks. A block needs room in the
// budget; all but readers_ of it are open to any file, the rest to the file being written
// only, whose blocks the writer is waiting for: every other file's blocks can wait for it.
void JsonlRun::read_files() {
    try {
        for (;;) {
            std::size_t file;
            {
                const std::lock_guard lock(mutex_);
                if (stopping_ || next_file_ == files_.size()) break;
                file = next_file_++;
            }
            LineBlocks blocks(files_[file]);
            for (std::size_t index = 0;; ++index) {
                {
                    std::unique_lock lock(mutex_);
                    changed_.wait(lock, [&] {
                        return stopping_ || in_flight_ < budget_ - readers_ ||
                               (file == head_file_ && in_flight_ < budget_);
                    });
                    if (stopping_) return;
                    ++in_flight_;
                }
                Block block = blocks.next();
                block.file = file;
                block.index = index;
                const bool last = block.last;
                {
                    const std::lock_guard lock(mutex_);
                    queue_.push_back(std::move(block));
                }
                changed_.notify_all();
                if (last) break;
            }
        }
    } catch (...) {
        fail(std::current_exception());
    }
    {
        const std::lock_guard lock(mutex_);
        --reading_;
    }
    changed_.notify_all();
}

void JsonlRun::encode_blocks() {
    try {
        for (;;) {
            Block block;
            {
                std::unique_lock lock(mutex_);
                changed_.wait(lock, [&] { return stopping_ || !queue_.empty() || reading_ == 0; });
                if (stopping_ || queue_.empty()) return;
                block = std::move(queue_.front());
                queue_.pop_front();
            }
            Encoded encoded = encode_block(block, opts_.field, tokenizer_);
            {
                const std::lock_guard lock(mutex_);
                done_.emplace(std::pair{block.file, block.index}, std::move(encoded));
            }
            changed_.notify_all();
        }
    } catch (...) {
        fail(std::current_exception());
    }
}

// The block the writer needs next, the progress drawn while it waits.
Encoded JsonlRun::wait_for(std::size_t file, std::size_t index, TokenizeProgress& progress) {
    const std::pair key{file, index};
    for (;;) {
        {
            std::unique_lock lock(mutex_);
            changed_.wait_for(lock, std::chrono::milliseconds(200),
                              [&] { return failure_ || done_.count(key); });
            if (failure_) std::rethrow_exception(failure_);
            if (const auto it = done_.find(key); it != done_.end()) {
                Encoded block = std::move(it->second);
                done_.erase(it);
                --in_flight_;
                if (block.last) head_file_ = file + 1;
                lock.unlock();
                changed_.notify_all();
                return block;
            }
        }
        progress.update(counts_.counts);
    }
}

void JsonlRun::write(const Encoded& block, std::size_t file, TokenizedOutput& output) {
    for (const Encoded::Malformed& bad : block.malformed) {
        const std::string where = files_[file] + ":" + std::to_string(lines_before_ + bad.line + 1);
        const std::string what =
            "not a JSON object with a string \"" + opts_.field + "\" (" + bad.what + ")";
        if (++counts_.malformed > opts_.max_bad_lines)
            throw Error(where + ": " + what + "; " +
                        (opts_.max_bad_lines == 0
                             ? std::string("--max-bad-lines N skips up to N such lines")
                             : "more than --max-bad-lines " + std::to_string(opts_.max_bad_lines)));
        if (counts_.malformed <= kShownMalformed)
            std::fprintf(stderr, "trident: warning: %s: %s; skipped\n", where.c_str(),
                         what.c_str());
    }
    std::size_t begin = 0;
    for (const std::size_t end : block.ends) {
        output.add_document(std::span(block.ids).subspan(begin, end - begin));
        begin = end;
    }
    lines_before_ = block.last ? 0 : lines_before_ + block.lines;
    TokenizeCounts& c = counts_.counts;
    c.done += block.disk;
    c.text += block.text;
    c.documents += block.ends.size();
    c.tokens += block.ids.size();
    counts_.empty += block.empty;
}

JsonlCounts JsonlRun::run(TokenizedOutput& output, TokenizeProgress& progress) {
    for (const std::string& f : files_) counts_.counts.total += std::filesystem::file_size(f);
    start();
    for (std::size_t file = 0; file < files_.size(); ++file)
        for (std::size_t index = 0;; ++index) {
            const Encoded block = wait_for(file, index, progress);
            write(block, file, output);
            progress.update(counts_.counts);
            if (block.last) break;
        }
    stop();
    if (counts_.malformed > kShownMalformed)
        std::fprintf(
            stderr, "trident: warning: %llu malformed lines skipped in all (the first %zu shown)\n",
            static_cast<unsigned long long>(counts_.malformed), kShownMalformed);
    return counts_;
}

}  // namespace

bool is_json_lines(const std::string& path) {
    std::string name = path;
    for (const char* compressed : {".gz", ".zst"})
        if (ends_with(name, compressed)) name.resize(name.size() - std::string(compressed).size());
    return ends_with(name, ".jsonl") || ends_with(name, ".json") || ends_with(name, ".ndjson");
}

JsonlCounts tokenize_json_lines(const TokenizeOptions& opts, const std::vector<std::string>& files,
                                const data::Tokenizer& tokenizer, TokenizedOutput& output,
                                TokenizeProgress& progress) {
    JsonlRun run(opts, files, tokenizer);
    return run.run(output, progress);
}

}  // namespace trident::commands
