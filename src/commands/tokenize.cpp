// `trident tokenize`: turns text files into training data, an llm.c token shard or a Megatron
// .bin/.idx pair, on every core.
//
// Documents are the input files, or the records of each file split on --split-on; each is
// written as the tokenizer's document start (a tokenizer.json's post-processor, e.g. Llama 3's
// <|begin_of_text|>), the text's ids, the document end, then its end-of-text token
// (<|endoftext|> for GPT-2) unless the document end already is that. Large documents are cut
// into chunks where the tokenizer allows (Tokenizer::can_cut: pre-tokenizers always split
// there anyway), so encoding chunks in parallel gives exactly the ids of encoding the whole
// text at once.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "commands/commands.h"
#include "data/megatron_dataset.h"
#include "data/token_shards.h"
#include "data/tokenizer.h"
#include "io/input_file.h"
#include "io/user_paths.h"
#include "kernels/error.h"
#include "kernels/threads.h"
#include "train/metrics.h"

namespace trident::commands {

namespace {

// "\n", "\t", "\r" and "\\" in --split-on, as users type them in a shell.
std::string unescape(const std::string& s) {
    std::string out;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '\\' || i + 1 == s.size()) {
            out += s[i];
            continue;
        }
        const char c = s[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
    }
    return out;
}

// Inputs are read whole into memory (and encoded in parallel): the cap keeps a wrong path,
// or a file far beyond one machine's memory, from being read until the kernel ends the run.
constexpr uint64_t kMaxInputBytes = uint64_t{16} << 30;

std::string read_file(const std::string& path) {
    return io::read_regular_file(path, kMaxInputBytes, "an input to tokenize");
}

// The documents of the files: each file whole, or its records between `separator`s (empty
// records dropped).
std::vector<std::string_view> split_documents(const std::vector<std::string>& files,
                                              const std::string& separator) {
    std::vector<std::string_view> documents;
    for (const std::string& text : files) {
        std::string_view rest = text;
        while (!separator.empty() && !rest.empty()) {
            const std::size_t at = rest.find(separator);
            if (at == std::string_view::npos) break;
            if (at > 0) documents.push_back(rest.substr(0, at));
            rest.remove_prefix(at + separator.size());
        }
        if (!rest.empty() || separator.empty()) documents.push_back(rest);
    }
    return documents;
}

// A piece of one document, encoded by one thread.
struct Chunk {
    std::size_t document;
    std::string_view text;
    std::vector<int32_t> ids;
};

// Cuts a document into chunks of about `target` bytes at safe points (see the file comment).
void cut(const data::Tokenizer& tokenizer, std::size_t document, std::string_view text,
         std::size_t target, std::vector<Chunk>& out) {
    while (text.size() > target) {
        std::size_t p = target;
        while (p < text.size() && !tokenizer.can_cut(text, p)) ++p;
        out.push_back({document, text.substr(0, p), {}});
        text.remove_prefix(p);
    }
    out.push_back({document, text, {}});
}

// Whether `path` starts as an llm.c shard does: its magic and version.
bool is_llmc_shard(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    int32_t head[2] = {0, 0};
    in.read(reinterpret_cast<char*>(head), sizeof head);
    return in && head[0] == data::kShardMagic && head[1] == data::kShardVersion;
}

// A file of the other format where this one is about to write (`bin`, the .bin it writes) is
// someone's data, not an old output of this kind: refused rather than overwritten.
void refuse_other_format(const std::string& bin, const std::string& format) {
    const std::string stem = bin.substr(0, bin.size() - 4);
    if (format == "megatron" && is_llmc_shard(bin))
        throw Error(bin + " is an llm.c token shard; --format megatron would overwrite it with " +
                    "the tokens of the Megatron dataset " + stem + " (" + stem + ".bin and " +
                    stem + ".idx): choose another --output or move it away");
    if (format == "llmc" && std::filesystem::exists(stem + ".idx") && !is_llmc_shard(bin) &&
        std::filesystem::exists(bin))
        throw Error(bin + " holds the tokens of the Megatron dataset " + stem + " (" + stem +
                    ".idx beside it); an llm.c shard would overwrite it: choose another --output "
                    "or move them away");
}

// Receives documents in order and writes them as one file or as shards of --shard-tokens.
class Output {
public:
    // `dtype`: the Megatron dataset's ids (u16, or i32 for a vocabulary beyond 16 bits).
    // Its directory is made by the check of the first output (tokenize()).
    Output(const TokenizeOptions& opts, kernels::DType dtype) : opts_(opts), dtype_(dtype) {}

    void add_document(std::span<const int32_t> ids) {
        tokens_ += ids.size();
        if (opts_.format == "megatron") {
            if (megatron_ && opts_.shard_tokens > 0 && shard_fill_ > 0 &&
                shard_fill_ + ids.size() > opts_.shard_tokens)
                close_megatron();
            if (!megatron_) {
                refuse_other_format(shard_name("") + ".bin", opts_.format);
                megatron_ = std::make_unique<data::MegatronWriter>(shard_name(""), dtype_);
            }
            megatron_->add_document(ids);
            shard_fill_ += ids.size();
            return;
        }
        pending_.insert(pending_.end(), ids.begin(), ids.end());
        while (opts_.shard_tokens > 0 && pending_.size() >= opts_.shard_tokens) {
            write_llmc(std::span(pending_).first(opts_.shard_tokens));
            pending_.erase(pending_.begin(),
                           pending_.begin() + static_cast<std::ptrdiff_t>(opts_.shard_tokens));
        }
    }

    void finish() {
        if (opts_.format == "megatron") {
            if (megatron_) close_megatron();
        } else if (!pending_.empty() || files_.empty()) {
            write_llmc(pending_);
        }
    }

    const std::vector<std::string>& files() const { return files_; }
    // The first output's .bin, checked before anything is encoded: a clash is found at once.
    std::string first_bin() const {
        return opts_.format == "megatron" ? shard_name("") + ".bin" : shard_name(".bin");
    }
    std::size_t tokens() const { return tokens_; }

private:
    // OUT, or OUT_000000 ... with shards; for Megatron a prefix (a .bin/.idx suffix dropped).
    std::string shard_name(const std::string& ext) const {
        std::string stem = opts_.output;
        std::string suffix = ext;
        for (const char* e : {".bin", ".idx"}) {
            const std::string s(e);
            if (stem.size() > s.size() && stem.compare(stem.size() - s.size(), s.size(), s) == 0) {
                stem.resize(stem.size() - s.size());
                if (opts_.format != "megatron") suffix = s;
            }
        }
        if (opts_.shard_tokens == 0) return stem + suffix;
        char index[16];
        std::snprintf(index, sizeof index, "_%06zu", shards_);
        return stem + index + suffix;
    }

    void write_llmc(std::span<const uint16_t> tokens) {
        const std::string name = shard_name(".bin");
        refuse_other_format(name, opts_.format);
        data::write_token_shard(name, tokens);
        files_.push_back(name);
        ++shards_;
    }

    void close_megatron() {
        const std::string prefix = shard_name("");
        megatron_->finish();
        megatron_.reset();
        files_.push_back(prefix + ".bin");
        files_.push_back(prefix + ".idx");
        ++shards_;
        shard_fill_ = 0;
    }

    const TokenizeOptions& opts_;
    kernels::DType dtype_;
    std::vector<uint16_t> pending_;  // llm.c: tokens not yet in a shard (ids below 65536)
    std::unique_ptr<data::MegatronWriter> megatron_;
    std::size_t shard_fill_ = 0;
    std::size_t tokens_ = 0;
    std::vector<std::string> files_;
    std::size_t shards_ = 0;  // outputs written (a Megatron one is two files)
};

// Joins each document's chunks, framed as the file comment says, and writes it.
void write_documents(const data::Tokenizer& tokenizer, const std::vector<Chunk>& chunks,
                     Output& output) {
    const std::span<const int32_t> start = tokenizer.document_start(),
                                   end = tokenizer.document_end();
    const std::optional<int32_t> eot = tokenizer.end_of_text();
    std::vector<int32_t> document(start.begin(), start.end());
    for (std::size_t i = 0; i < chunks.size(); ++i) {
        document.insert(document.end(), chunks[i].ids.begin(), chunks[i].ids.end());
        if (i + 1 < chunks.size() && chunks[i + 1].document == chunks[i].document) continue;
        document.insert(document.end(), end.begin(), end.end());
        if (eot && (end.empty() || end.back() != *eot)) document.push_back(*eot);
        output.add_document(document);
        document.assign(start.begin(), start.end());
    }
    output.finish();
}

void draw_progress(std::size_t done, std::size_t total, double seconds) {
    constexpr int kWidth = 30;
    const double f = total ? static_cast<double>(done) / total : 1.0;
    const int filled = static_cast<int>(f * kWidth);
    std::fprintf(stderr, "\rtokenizing [%s%s] %5.1f%% %.1f/%.1f MB %.1f MB/s",
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                 100 * f, done / 1e6, total / 1e6, seconds > 0 ? done / 1e6 / seconds : 0.0);
}

}  // namespace

int tokenize(const TokenizeOptions& opts) {
    if (opts.format != "llmc" && opts.format != "megatron")
        throw Error("--format: expected llmc or megatron, got '" + opts.format + "'");
    const auto tokenizer = data::make_tokenizer(opts.tokenizer);
    // llm.c shards hold uint16 ids; a Megatron dataset takes int32 beyond them, as Megatron-LM
    // does for a vocabulary outgrowing 16 bits.
    const bool wide = tokenizer->vocab_size() > 65536;
    if (wide && opts.format == "llmc")
        throw Error("a vocabulary of " + std::to_string(tokenizer->vocab_size()) +
                    " ids does not fit the uint16 ids of llm.c shards: use --format megatron, "
                    "which writes int32 ids");
    const auto t0 = std::chrono::steady_clock::now();

    Output output(opts, wide ? kernels::DType::i32 : kernels::DType::u16);
    for (const std::string& path : opts.inputs) io::check_input_path(path, "an input to tokenize");
    io::check_output_file(output.first_bin(), "--output");
    if (opts.format == "megatron")
        io::check_output_file(output.first_bin().substr(0, output.first_bin().size() - 4) + ".idx",
                              "--output");
    refuse_other_format(output.first_bin(), opts.format);

    std::vector<std::string> files;
    for (const std::string& path : opts.inputs) files.push_back(read_file(path));
    std::size_t total_bytes = 0;
    for (const std::string& text : files) total_bytes += text.size();
    const std::vector<std::string_view> documents = split_documents(files, unescape(opts.split_on));

    const kernels::ThreadCount bounded = kernels::thread_count(opts.threads, "--threads");
    if (!bounded.note.empty()) std::fprintf(stderr, "trident: warning: %s\n", bounded.note.c_str());
    const int threads = bounded.count;
    // Chunks small enough to share among threads and show progress, large enough to be cheap.
    const std::size_t target =
        std::clamp<std::size_t>(total_bytes / (16 * threads), 1 << 16, 1 << 22);
    std::vector<Chunk> chunks;
    for (std::size_t d = 0; d < documents.size(); ++d)
        cut(*tokenizer, d, documents[d], target, chunks);
    // The progress counts the bytes encoded: the documents, not the separators between them.
    std::size_t document_bytes = 0;
    for (const Chunk& chunk : chunks) document_bytes += chunk.text.size();

    std::atomic<std::size_t> next{0}, bytes_done{0}, chunks_done{0};
    std::vector<std::thread> pool;
    std::exception_ptr failure;
    std::atomic<bool> failed{false};
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&] {
            try {
                for (std::size_t i; !failed && (i = next++) < chunks.size();) {
                    tokenizer->encode(chunks[i].text, chunks[i].ids);
                    bytes_done += chunks[i].text.size();
                    ++chunks_done;
                }
            } catch (...) {
                if (!failed.exchange(true)) failure = std::current_exception();
            }
        });
    }
    const bool show_progress = opts.progress;
    while (show_progress && chunks_done < chunks.size() && !failed) {
        draw_progress(bytes_done, document_bytes,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (auto& th : pool) th.join();
    if (failure) std::rethrow_exception(failure);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (show_progress) {
        draw_progress(document_bytes, document_bytes, seconds);
        std::fprintf(stderr, "\n");
    }

    write_documents(*tokenizer, chunks, output);
    std::printf("tokenized %.2f MB (%s) into %s in %.2f s: %.2f MB/s on %s\n", total_bytes / 1e6,
                train::counted(static_cast<int64_t>(documents.size()), "document").c_str(),
                train::counted(static_cast<int64_t>(output.tokens()), "token").c_str(), seconds,
                total_bytes / 1e6 / seconds, train::counted(threads, "thread").c_str());
    for (const std::string& f : output.files()) std::printf("wrote %s\n", f.c_str());
    return 0;
}

}  // namespace trident::commands
