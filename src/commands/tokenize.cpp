// `trident tokenize`: turns text files or JSON-lines corpora (tokenize_jsonl.h) into training
// data, llm.c token shards or Megatron .bin/.idx pairs (tokenize_output.h), on every core.
//
// Documents of text files are the files, or the records of each file split on --split-on; each is
// written as the tokenizer's document start (a tokenizer.json's post-processor, e.g. Llama 3's
// <|begin_of_text|>), the text's ids, the document end, then its end-of-text token
// (<|endoftext|> for GPT-2) unless the document end already is that. Large documents are cut
// into chunks where the tokenizer allows (Tokenizer::can_cut: pre-tokenizers always split
// there anyway), so encoding chunks in parallel gives exactly the ids of encoding the whole
// text at once.
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "commands/commands.h"
#include "commands/session.h"
#include "commands/tokenize_jsonl.h"
#include "commands/tokenize_output.h"
#include "commands/tokenize_progress.h"
#include "data/byte_source.h"
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

// Joins each document's chunks, framed (frame_document), and writes it.
void write_documents(const data::Tokenizer& tokenizer, const std::vector<Chunk>& chunks,
                     TokenizedOutput& output) {
    std::vector<int32_t> ids, document;
    for (std::size_t i = 0; i < chunks.size(); ++i) {
        ids.insert(ids.end(), chunks[i].ids.begin(), chunks[i].ids.end());
        if (i + 1 < chunks.size() && chunks[i + 1].document == chunks[i].document) continue;
        document.clear();
        frame_document(tokenizer, ids, document);
        output.add_document(document);
        ids.clear();
    }
}

// Encodes the text files' documents on opts.threads threads (bounded by tokenize()) and writes
// them in order.
TokenizeCounts tokenize_text(const TokenizeOptions& opts, const std::vector<std::string>& paths,
                             const data::Tokenizer& tokenizer, TokenizedOutput& output,
                             TokenizeProgress& progress) {
    std::vector<std::string> files;
    for (const std::string& path : paths) files.push_back(read_file(path));
    const std::vector<std::string_view> documents = split_documents(files, unescape(opts.split_on));
    const int threads = opts.threads;
    std::size_t total_bytes = 0;
    for (const std::string& text : files) total_bytes += text.size();
    // Chunks small enough to share among threads and show progress, large enough to be cheap.
    const std::size_t target =
        std::clamp<std::size_t>(total_bytes / (16 * threads), 1 << 16, 1 << 22);
    std::vector<Chunk> chunks;
    for (std::size_t d = 0; d < documents.size(); ++d)
        cut(tokenizer, d, documents[d], target, chunks);
    // The progress counts the bytes encoded: the documents, not the separators between them.
    TokenizeCounts counts;
    for (const Chunk& chunk : chunks) counts.total += chunk.text.size();

    std::atomic<std::size_t> next{0}, bytes_done{0}, chunks_done{0};
    std::vector<std::thread> pool;
    std::exception_ptr failure;
    std::atomic<bool> failed{false};
    for (int t = 0; t < threads; ++t) {
        pool.emplace_back([&] {
            try {
                for (std::size_t i; !failed && (i = next++) < chunks.size();) {
                    tokenizer.encode(chunks[i].text, chunks[i].ids);
                    bytes_done += chunks[i].text.size();
                    ++chunks_done;
                }
            } catch (...) {
                if (!failed.exchange(true)) failure = std::current_exception();
            }
        });
    }
    while (chunks_done < chunks.size() && !failed) {
        counts.done = counts.text = bytes_done;
        progress.update(counts);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (auto& th : pool) th.join();
    if (failure) std::rethrow_exception(failure);
    counts.done = counts.text = counts.total;
    counts.documents = documents.size();
    write_documents(tokenizer, chunks, output);
    counts.tokens = output.tokens();
    return counts;
}

// The inputs, each a path or a glob (its matches in name order); a path no system call could
// take (io/user_paths.h), a glob matching nothing, or a path that is no regular file, is named
// at once.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
    for (const std::string& input : inputs) io::check_input_path(input, "an input to tokenize");
    std::vector<std::string> paths;
    for (const std::string& input : inputs) {
        if (input.find_first_of("*?[") == std::string::npos) {
            paths.push_back(input);
            continue;
        }
        const std::size_t before = paths.size();
        glob_t g{};
        if (::glob(input.c_str(), 0, nullptr, &g) == 0)  // sorted by name
            for (std::size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
        globfree(&g);
        if (paths.size() == before) throw Error("no file matches '" + input + "'");
    }
    for (const std::string& path : paths) ::close(io::open_regular(path));
    return paths;
}

// JSON lines (tokenize_jsonl.h) or text, not both: each is read its own way.
bool json_lines_inputs(const TokenizeOptions& opts, const std::vector<std::string>& paths) {
    const auto json = std::count_if(paths.begin(), paths.end(), is_json_lines);
    if (json > 0 && json < static_cast<std::ptrdiff_t>(paths.size()))
        throw Error(
            "the inputs mix JSON-lines files (.jsonl, .json, .ndjson) with text files: "
            "tokenize each kind in a run of its own");
    if (json > 0 && !opts.split_on.empty())
        throw Error("--split-on splits text files; in JSON lines each line is a document");
    for (const std::string& path : paths)
        if (json == 0 && data::compression_of(path) != data::Compression::none)
            throw Error(path +
                        ": compressed text is not read; JSON lines (.jsonl.gz, .jsonl.zst) "
                        "may be compressed, text files must not");
    return json > 0;
}

// "tokenized 4.40 MB of text (1189 documents) into 1169600 tokens in 2.34 s: 1.88 MB/s on 4
// threads", and for JSON lines what was left out.
void print_summary(const TokenizeOptions& opts, const TokenizeCounts& c, const JsonlCounts* jsonl,
                   std::size_t files, double seconds) {
    std::string what = train::counted(static_cast<int64_t>(c.documents), "document");
    if (jsonl)
        what += " of " + train::counted(static_cast<int64_t>(files), "file") + "; " +
                std::to_string(jsonl->empty) + " empty and " + std::to_string(jsonl->malformed) +
                " malformed skipped";
    std::printf("tokenized %s of %s (%s) into %s in %.2f s: %.2f MB/s on %s\n",
                megabytes(c.text).c_str(), jsonl ? "JSON lines" : "text", what.c_str(),
                train::counted(static_cast<int64_t>(c.tokens), "token").c_str(), seconds,
                static_cast<double>(c.text) / 1e6 / seconds,
                train::counted(opts.threads, "thread").c_str());
}

}  // namespace

int tokenize(const TokenizeOptions& opts) {
    if (opts.format != "llmc" && opts.format != "megatron")
        throw Error("--format: expected llmc or megatron, got '" + opts.format + "'");
    if (opts.field.empty()) throw Error("--field: expected a key of the JSON lines, got ''");
    if (opts.format == "llmc" && opts.shard_tokens > data::kMaxShardTokens)
        throw Error("--shard-tokens: an llm.c shard holds at most " +
                    std::to_string(data::kMaxShardTokens) + " tokens, got " +
                    std::to_string(opts.shard_tokens));
    const std::vector<std::string> paths = expand_inputs(opts.inputs);
    const bool json = json_lines_inputs(opts, paths);
    const auto tokenizer = data::make_tokenizer(opts.tokenizer);
    // llm.c shards hold uint16 ids; a Megatron dataset takes int32 beyond them, as Megatron-LM
    // does for a vocabulary outgrowing 16 bits.
    const bool wide = tokenizer->vocab_size() > 65536;
    if (wide && opts.format == "llmc")
        throw Error("a vocabulary of " + std::to_string(tokenizer->vocab_size()) +
                    " ids does not fit the uint16 ids of llm.c shards: use --format megatron, "
                    "which writes int32 ids");

    TokenizedOutput output(opts, wide ? kernels::DType::i32 : kernels::DType::u16);
    // --threads bounded once (kernels/threads.h), for text and JSON lines alike.
    TokenizeOptions run = opts;
    const kernels::ThreadCount bounded = kernels::thread_count(opts.threads, "--threads");
    if (!bounded.note.empty()) warn(bounded.note);
    run.threads = bounded.count;
    TokenizeProgress progress(run.progress);
    JsonlCounts jsonl;
    if (json)
        jsonl = tokenize_json_lines(run, paths, *tokenizer, output, progress);
    else
        jsonl.counts = tokenize_text(run, paths, *tokenizer, output, progress);
    progress.finish(jsonl.counts);
    const std::vector<std::string> written = output.commit();
    print_summary(run, jsonl.counts, json ? &jsonl : nullptr, paths.size(), progress.seconds());
    for (const std::string& f : written) std::printf("wrote %s\n", f.c_str());
    return 0;
}

}  // namespace trident::commands
