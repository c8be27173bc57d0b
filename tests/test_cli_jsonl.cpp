// Command-line tests of `trident tokenize` on JSON-lines corpora: .jsonl, .jsonl.gz and
// .jsonl.zst give one stream of documents (an end of text after each), read back by the
// dataset readers; --field, many files and globs in order, any thread count, shards of either
// format; malformed lines named by file and line, skipped up to --max-bad-lines and otherwise
// stopping the run with nothing written; the progress as plain lines in a log. Python's json
// module checks the same files independently (tests/python/test_tokenize_jsonl.py).
#include <zstd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "cli_support.h"
#include "data/gpt2_tokenizer.h"
#include "data/megatron_dataset.h"
#include "data/token_shards.h"

using namespace cli;
using Catch::Contains;

namespace {

std::vector<int32_t> gpt2_stream(const std::string& path) {
    return read_all(trident::data::TokenShards(path, 50257, "test"));
}

// `texts` as JSON lines, each with other members around its text.
std::string json_lines(const std::vector<std::string>& texts) {
    std::string out;
    for (std::size_t i = 0; i < texts.size(); ++i)
        out += "{\"id\": " + std::to_string(i) + ", \"text\": \"" + texts[i] +
               "\", \"meta\": {\"score\": 0.5}}\n";
    return out;
}

std::string zstd(const std::string& text) {
    std::string out(ZSTD_compressBound(text.size()), '\0');
    out.resize(ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3));
    return out;
}

// Writes `bytes` as the file `name` of the workspace.
std::string put(const Workspace& ws, const std::string& name, const std::string& bytes) {
    std::ofstream(ws.path(name), std::ios::binary) << bytes;
    return ws.path(name);
}

// About `bytes` of varied documents, so that a file is cut into several blocks.
std::vector<std::string> many_documents(std::size_t bytes) {
    std::vector<std::string> texts;
    for (std::size_t total = 0, i = 0; total < bytes; ++i) {
        std::string t =
            "Document " + std::to_string(i) + ": and the evening and the morning were day ";
        for (std::size_t k = 0; k < i % 40; ++k) t += std::to_string(k * 7 % 13) + " words\\n";
        total += t.size();
        texts.push_back(t);
    }
    return texts;
}

const std::string kTokenize = "tokenize --no-progress ";

}  // namespace

TEST_CASE("tokenize jsonl: plain, gzip and zstd give each document its ids and an end of text",
          "[cli][tokenize][jsonl]") {
    Workspace ws;
    const std::string lines = json_lines({"In the beginning", "God created", "", "the heaven"});
    const std::string plain = put(ws, "a.jsonl", lines);
    const std::string zst = put(ws, "a.jsonl.zst", zstd(lines));
    REQUIRE(run_shell("gzip -k " + plain).exit_code == 0);
    for (const std::string& in : {plain, plain + ".gz", zst}) {
        INFO(in);
        const RunResult r = require_ok(run(kTokenize + "--output " + ws.path("o.bin") + " " + in));
        CHECK_THAT(r.output, Contains("tokenized 0.0 MB of JSON lines (3 documents of 1 file; 1 "
                                      "empty and 0 malformed skipped) into "));
        // GPT-2's ids of each text, then <|endoftext|>; the empty text is left out.
        const trident::data::Gpt2Tokenizer bpe(TRIDENT_SOURCE_DIR "/data/gpt2");
        std::vector<int32_t> expected;
        for (const char* text : {"In the beginning", "God created", "the heaven"}) {
            bpe.encode(text, expected);
            expected.push_back(50256);
        }
        CHECK(gpt2_stream(ws.path("o.bin")) == expected);
    }
}

TEST_CASE("tokenize jsonl: --field, files and globs in order, any thread count",
          "[cli][tokenize][jsonl]") {
    Workspace ws;
    put(ws, "p_1.jsonl", "{\"body\": \"one\", \"text\": 1}\n");
    put(ws, "p_2.jsonl.zst", zstd("{\"body\": \"two\"}\n{\"body\": \"three\"}\n"));
    put(ws, "q.jsonl", "{\"body\": \"four\"}");  // no newline after the last line
    require_ok(run(kTokenize + "--tokenizer bytes --field body --output " + ws.path("o.bin") +
                   " '" + ws.path("p_*") + "' " + ws.path("q.jsonl")));
    CHECK(read_all(trident::data::TokenShards(ws.path("o.bin"), 256, "test")) ==
          bytes_of("onetwothreefour"));

    // A file of many blocks: the same ids on 1 and 4 threads, and as the text path gives them.
    const std::vector<std::string> texts = many_documents(3 << 20);
    put(ws, "big.jsonl.zst", zstd(json_lines(texts)));
    for (const char* threads : {"1", "4"})
        require_ok(run(kTokenize + "--threads " + threads + " --output " +
                       ws.path(std::string("t") + threads + ".bin") + " " +
                       ws.path("big.jsonl.zst")));
    const auto one = gpt2_stream(ws.path("t1.bin"));
    CHECK(one.size() > 500000);
    CHECK(one == gpt2_stream(ws.path("t4.bin")));
    std::string text;
    for (const std::string& t : texts) {  // the JSON escape \n as the newline it stands for
        for (std::size_t i = 0; i < t.size(); ++i) {
            const bool escape = t.compare(i, 2, "\\n") == 0;
            text += escape ? '\n' : t[i];
            i += escape ? 1 : 0;
        }
        text += "@@SEP@@";
    }
    put(ws, "big.txt", text);
    require_ok(run(kTokenize + "--split-on @@SEP@@ --output " + ws.path("text.bin") + " " +
                   ws.path("big.txt")));
    CHECK(one == gpt2_stream(ws.path("text.bin")));
}

TEST_CASE("tokenize jsonl: shards of either format read back as the one stream",
          "[cli][tokenize][jsonl]") {
    Workspace ws;
    const std::vector<std::string> texts = many_documents(200000);
    const std::string in = put(ws, "c.jsonl", json_lines(texts));
    require_ok(run(kTokenize + "--output " + ws.path("whole.bin") + " " + in));
    const auto whole = gpt2_stream(ws.path("whole.bin"));
    require_ok(run(kTokenize + "--shard-tokens 10000 --output " + ws.path("s.bin") + " " + in));
    CHECK(trident::data::TokenShards(ws.path("s_000000.bin"), 50257, "test").size() == 10000);
    CHECK(gpt2_stream(ws.path("s_*.bin")) == whole);
    require_ok(run(kTokenize + "--format megatron --shard-tokens 10000 --output " + ws.path("m") +
                   " " + in));
    std::vector<int32_t> megatron;
    std::size_t documents = 0;
    for (int s = 0; std::filesystem::exists(ws.path("m_00000" + std::to_string(s) + ".idx")); ++s) {
        const trident::data::MegatronDataset shard(ws.path("m_00000" + std::to_string(s)), 50257,
                                                   "test");
        CHECK(shard.size() <= 10000);  // whole documents, none above 10000 tokens here
        documents += shard.documents();
        const auto ids = read_all(shard);
        megatron.insert(megatron.end(), ids.begin(), ids.end());
    }
    CHECK(documents == texts.size());
    CHECK(megatron == whole);
}

TEST_CASE("tokenize jsonl: malformed lines are named, skipped up to --max-bad-lines, else stop",
          "[cli][tokenize][jsonl][bad-input]") {
    Workspace ws;
    const std::string in = put(ws, "b.jsonl",
                               "{\"text\": \"fine\"}\n"
                               "{\"text\": \"cut short\n"
                               "\n"
                               "{\"txt\": \"no text key\"}\n"
                               "{\"text\": \"fine again\"}\n");
    const std::string out = " --tokenizer bytes --output " + ws.path("o.bin") + " " + in;
    // An earlier output stays as it was when the run stops.
    put(ws, "o.bin", "earlier");
    require_clear_error(run(kTokenize + out),
                        in + ":2: not a JSON object with a string \"text\" (byte 19: "
                             "unterminated string); --max-bad-lines N skips up to N such lines");
    std::ifstream earlier(ws.path("o.bin"));
    CHECK(std::string(std::istreambuf_iterator<char>(earlier), {}) == "earlier");
    CHECK(std::distance(fs::directory_iterator(ws.dir), {}) == 4);  // no temporary file left

    require_clear_error(run(kTokenize + "--max-bad-lines 1" + out),
                        in + ":4: not a JSON object with a string \"text\" (byte 22: no \"text\" "
                             "key); more than --max-bad-lines 1");
    const RunResult two = require_ok(run(kTokenize + "--max-bad-lines 2" + out));
    CHECK_THAT(two.output, Contains("trident: warning: " + in + ":2: not a JSON object"));
    CHECK_THAT(two.output, Contains("trident: warning: " + in + ":4: not a JSON object"));
    CHECK_THAT(two.output, Contains("(2 documents of 1 file; 0 empty and 2 malformed skipped)"));
    CHECK(read_all(trident::data::TokenShards(ws.path("o.bin"), 256, "test")) ==
          bytes_of("finefine again"));
}

TEST_CASE("tokenize jsonl: inputs it cannot read as asked are refused by name",
          "[cli][tokenize][jsonl][bad-input]") {
    Workspace ws;
    const std::string json = put(ws, "a.jsonl", "{\"text\": \"x\"}\n");
    const std::string text = put(ws, "a.txt", "x");
    const std::string out = "--output " + ws.path("o.bin") + " ";
    require_clear_error(run(kTokenize + out + json + " " + text),
                        "the inputs mix JSON-lines files (.jsonl, .json, .ndjson) with text files");
    require_clear_error(run(kTokenize + "--split-on x " + out + json),
                        "--split-on splits text files; in JSON lines each line is a document");
    const std::string gz_text = put(ws, "a.txt.gz", "x");
    require_clear_error(run(kTokenize + out + gz_text), gz_text + ": compressed text is not read");
    require_clear_error(run(kTokenize + out + "'" + ws.path("none_*.jsonl") + "'"),
                        "no file matches '" + ws.path("none_*.jsonl") + "'");
    const std::string fake = put(ws, "fake.jsonl.zst", "{\"text\": \"x\"}\n");
    require_clear_error(run(kTokenize + out + fake), fake + ": not zstd data");
    require_clear_error(run(kTokenize + "--field '' " + out + json), "--field");
    require_clear_error(run(kTokenize + out + ws.path("missing.jsonl")), "missing.jsonl");
    CHECK_FALSE(fs::exists(ws.path("o.bin")));
}

TEST_CASE("tokenize jsonl: the progress is plain lines where stderr is no terminal",
          "[cli][tokenize][jsonl]") {
    Workspace ws;
    const std::string in = put(ws, "a.jsonl", json_lines({"one", "two"}));
    // The test reads the output through a pipe: no carriage return may reach it.
    const RunResult r = require_ok(run("tokenize --output " + ws.path("o.bin") + " " + in));
    CHECK_THAT(r.output, Contains("tokenize: 100.0% of 0.0 MB | "));
    CHECK_THAT(r.output, Contains(" | 2 documents | 4 tokens | ETA 0s\n"));
    CHECK(r.output.find('\r') == std::string::npos);
    const std::string text = put(ws, "a.txt", "some text");
    const RunResult t = require_ok(run("tokenize --output " + ws.path("t.bin") + " " + text));
    CHECK(t.output.find('\r') == std::string::npos);
    CHECK_THAT(t.output, Contains("tokenize: 100.0%"));
}
