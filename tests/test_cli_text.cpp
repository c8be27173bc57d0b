// Command-line tests of the text commands: `trident tokenize` writes what the dataset readers
// read back (llm.c shards and Megatron pairs, documents, shards, any thread count), and
// `trident generate` continues a prompt from a checkpoint or from exported weights.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "cli_support.h"
#include "data/gpt2_tokenizer.h"
#include "data/megatron_dataset.h"
#include "data/token_shards.h"
#include "small_tokenizer_json.h"

using namespace cli;
using Catch::Contains;

namespace {

// A text of many lines, long enough to be cut into several chunks.
std::string long_text() {
    std::string text;
    for (int i = 0; text.size() < 300000; ++i)
        text += "Line " + std::to_string(i) + ": and the  evening\tand the morning were day " +
                std::to_string(i * 7 % 13) + ".\n" + (i % 5 == 0 ? "\n\n" : "");
    return text;
}

}  // namespace

TEST_CASE("tokenize: bytes into one llm.c shard, files are documents", "[cli][tokenize]") {
    Workspace ws;
    const auto a = ws.write("a.txt", "hello\n"), b = ws.write("b.txt", "world");
    const RunResult r = run("tokenize --tokenizer bytes --no-progress --output " +
                            ws.path("o.bin") + " " + a + " " + b);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const trident::data::TokenShards shard(ws.path("o.bin"), 256, "test");
    REQUIRE(read_all(shard) == bytes_of("hello\nworld"));  // no end-of-text in 256 ids
}

TEST_CASE("tokenize: GPT-2 ids with <|endoftext|> after each document", "[cli][tokenize]") {
    Workspace ws;
    const std::string text = "In the beginning God created the heaven and the earth.";
    const auto a = ws.write("a.txt", text), b = ws.write("b.txt", " Amen.");
    const RunResult r =
        run("tokenize --no-progress --output " + ws.path("o.bin") + " " + a + " " + b);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const trident::data::Gpt2Tokenizer bpe(TRIDENT_SOURCE_DIR "/data/gpt2");
    std::vector<int32_t> expected;
    bpe.encode(text, expected);
    expected.push_back(50256);
    bpe.encode(" Amen.", expected);
    expected.push_back(50256);
    REQUIRE(read_all(trident::data::TokenShards(ws.path("o.bin"), 50257, "test")) == expected);
    CHECK_THAT(r.output, Contains("(2 documents)"));
}

TEST_CASE("tokenize: GPT-2 ids with <|endoftext|> after each --split-on record",
          "[cli][tokenize]") {
    Workspace ws;
    const auto in = ws.write("r.txt", "one\n\ntwo two\n\n\n\nthree");
    const RunResult r =
        run("tokenize --no-progress --split-on '\\n\\n' --output " + ws.path("o.bin") + " " + in);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.output, Contains("(3 documents)"));  // the empty record is dropped
    const trident::data::Gpt2Tokenizer bpe(TRIDENT_SOURCE_DIR "/data/gpt2");
    std::vector<int32_t> expected;
    for (const char* record : {"one", "two two", "three"}) {
        bpe.encode(record, expected);
        expected.push_back(50256);
    }
    REQUIRE(read_all(trident::data::TokenShards(ws.path("o.bin"), 50257, "test")) == expected);
}

TEST_CASE("tokenize: the ids do not depend on the thread count", "[cli][tokenize]") {
    Workspace ws;
    const auto in = ws.write("long.txt", long_text());
    for (const char* threads : {"1", "4"})
        REQUIRE(run(std::string("tokenize --no-progress --threads ") + threads + " --output " +
                    ws.path(std::string("t") + threads + ".bin") + " " + in)
                    .exit_code == 0);
    const auto one = read_all(trident::data::TokenShards(ws.path("t1.bin"), 50257, "test"));
    const auto four = read_all(trident::data::TokenShards(ws.path("t4.bin"), 50257, "test"));
    REQUIRE(one.size() > 50000);
    REQUIRE(one == four);
}

TEST_CASE("tokenize: Megatron output with records and shards reads back", "[cli][tokenize]") {
    Workspace ws;
    const auto in = ws.write("r.txt", "one\n\ntwo two\n\n\n\nthree three three\n\nfour");
    SECTION("one pair, a document per record") {
        const RunResult r =
            run("tokenize --tokenizer bytes --no-progress --format megatron "
                "--split-on '\\n\\n' --output " +
                ws.path("m") + " " + in);
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        const trident::data::MegatronDataset meg(ws.path("m"), 256, "test");
        REQUIRE(meg.documents() == 4);  // the empty record between two separators is dropped
        REQUIRE(read_all(meg) == bytes_of("onetwo twothree three threefour"));
    }
    SECTION("shards of whole documents") {
        const RunResult r =
            run("tokenize --tokenizer bytes --no-progress --format megatron "
                "--split-on '\\n\\n' --shard-tokens 12 --output " +
                ws.path("m") + " " + in);
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        // one(3) + two two(7) = 10 <= 12; three three three (17) alone; four (4).
        const trident::data::MegatronDataset s0(ws.path("m_000000"), 256, "test");
        const trident::data::MegatronDataset s1(ws.path("m_000001"), 256, "test");
        const trident::data::MegatronDataset s2(ws.path("m_000002"), 256, "test");
        REQUIRE(read_all(s0) == bytes_of("onetwo two"));
        REQUIRE(read_all(s1) == bytes_of("three three three"));
        REQUIRE(read_all(s2) == bytes_of("four"));
    }
    SECTION("llm.c shards of exactly N tokens, read back as one glob") {
        const RunResult r =
            run("tokenize --tokenizer bytes --no-progress --shard-tokens 5 "
                "--output " +
                ws.path("s.bin") + " " + in);
        INFO(r.output);
        REQUIRE(r.exit_code == 0);
        const trident::data::TokenShards first(ws.path("s_000000.bin"), 256, "test");
        REQUIRE(first.size() == 5);
        const trident::data::TokenShards all(ws.path("s_*.bin"), 256, "test");
        REQUIRE(read_all(all) == bytes_of("one\n\ntwo two\n\n\n\nthree three three\n\nfour"));
    }
}

TEST_CASE("tokenize: the progress bar ends when --split-on drops separators", "[cli][tokenize]") {
    // The separators are not encoded, so the bar must count the bytes that are; a bar that
    // waits for every byte of the input never ends (the timeout turns that hang into exit 124).
    Workspace ws;
    const auto in = ws.write("r.txt", "one\n\ntwo two\n\n\n\nthree three three\n\nfour");
    const RunResult r = run_shell("timeout 20 " + std::string(TRIDENT_BINARY) +
                                  " tokenize --tokenizer bytes --format megatron --split-on "
                                  "'\\n\\n' --output " +
                                  ws.path("m") + " " + in);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("100.0%") != std::string::npos);
    const trident::data::MegatronDataset meg(ws.path("m"), 256, "test");
    CHECK(meg.documents() == 4);
}

TEST_CASE("tokenize: bad arguments are reported", "[cli][tokenize][bad-input]") {
    Workspace ws;
    const auto in = ws.write("a.txt", "x");
    require_clear_error(
        run("tokenize --no-progress --output " + ws.path("o.bin") + " " + ws.path("missing.txt")),
        "missing.txt");
    require_clear_error(
        run("tokenize --no-progress --format parquet --output " + ws.path("o") + " " + in),
        "--format");
    require_clear_error(
        run("tokenize --no-progress --tokenizer sentencepiece --output " + ws.path("o") + " " + in),
        "sentencepiece");
    const auto tokenizer_json = ws.write("tokenizer.json", "{\"model\": {\"type\": \"Unigram\"}}");
    require_clear_error(run("tokenize --no-progress --tokenizer " + tokenizer_json + " --output " +
                            ws.path("o") + " " + in),
                        tokenizer_json + ": model.type: \"Unigram\" is not supported");
    require_clear_error(run("tokenize --no-progress --tokenizer " + ws.path("none.json") +
                            " --output " + ws.path("o") + " " + in),
                        "none.json");
}

TEST_CASE("tokenize: names the files it wrote and never overwrites the other format's",
          "[cli][tokenize]") {
    Workspace ws;
    const auto in = ws.write("a.txt", "some text");
    const std::string bytes = "tokenize --tokenizer bytes --no-progress ";
    const RunResult llmc = run(bytes + "--output " + ws.path("x.bin") + " " + in);
    REQUIRE(llmc.exit_code == 0);
    CHECK_THAT(llmc.output, Contains("wrote " + ws.path("x.bin") + "\n"));
    const auto shard = fs::file_size(ws.path("x.bin"));
    // A Megatron prefix whose .bin is that shard: refused, the shard untouched.
    require_clear_error(run(bytes + "--format megatron --output " + ws.path("x") + " " + in),
                        ws.path("x.bin") +
                            " is an llm.c token shard; --format megatron would "
                            "overwrite it");
    CHECK(fs::file_size(ws.path("x.bin")) == shard);
    CHECK_FALSE(fs::exists(ws.path("x.idx")));

    const RunResult meg = run(bytes + "--format megatron --output " + ws.path("y") + " " + in);
    REQUIRE(meg.exit_code == 0);
    CHECK_THAT(meg.output, Contains("wrote " + ws.path("y.bin") + "\nwrote " + ws.path("y.idx")));
    const auto tokens = fs::file_size(ws.path("y.bin"));
    // An llm.c shard over a Megatron dataset's tokens: refused likewise.
    require_clear_error(run(bytes + "--output " + ws.path("y.bin") + " " + in),
                        ws.path("y.bin") + " holds the tokens of the Megatron dataset");
    CHECK(fs::file_size(ws.path("y.bin")) == tokens);
    // Each format over its own old output is a rewrite, as before.
    REQUIRE(run(bytes + "--format megatron --output " + ws.path("y") + " " + in).exit_code == 0);
    REQUIRE(run(bytes + "--output " + ws.path("x.bin") + " " + in).exit_code == 0);
}

TEST_CASE("generate: continues a prompt from a checkpoint and from exported weights",
          "[cli][generate]") {
    Workspace ws;
    // A byte-level model: its text needs no tokenizer files.
    const std::string byte_model =
        "--set model.vocab_size=256 --set data.train=" + ws.path("b.bin");
    trident::data::write_token_shard(ws.path("b.bin"), std::vector<uint16_t>(500, 'a'));
    REQUIRE(run(ws.train(byte_model +
                         " --set training.steps=30 --set training.lr=1e-2 "
                         "--set checkpoint.dir=" +
                         ws.path("ck")))
                .exit_code == 0);
    const std::string greedy = " --prompt aaa --tokens 10 --temperature 0";
    const RunResult from_checkpoint = run("generate --checkpoint " + ws.path("ck") + greedy);
    INFO(from_checkpoint.output);
    REQUIRE(from_checkpoint.exit_code == 0);
    // The settings on stderr, then the text: it learnt only 'a'.
    REQUIRE(from_checkpoint.output ==
            "generate: 10 tokens, greedy (temperature 0)\n" + std::string(13, 'a') + "\n");
    // Unless told otherwise, it samples as the training sample does, and says so.
    const RunResult sampled = run("generate --checkpoint " + ws.path("ck") + " --prompt aaa");
    INFO(sampled.output);
    REQUIRE(sampled.exit_code == 0);
    REQUIRE(sampled.output.starts_with("generate: 64 tokens, temperature 0.8, top-k 40, seed 0\n"));

    // The export's config.json tells generate the tiny model's heads (8 wide: hidden 32 / 4
    // heads), which the weights' shapes do not; without it --head-dim must.
    REQUIRE(run("export --checkpoint " + ws.path("ck") + " --output " + ws.path("w.safetensors"))
                .exit_code == 0);
    REQUIRE(fs::exists(ws.path("config.json")));
    const RunResult from_weights = run("generate --weights " + ws.path("w.safetensors") + greedy);
    INFO(from_weights.output);
    REQUIRE(from_weights.output == from_checkpoint.output);
    require_clear_error(
        run("generate --weights " + ws.path("w.safetensors") + " --head-dim 16" + greedy),
        "--head-dim 16 disagrees with " + ws.path("config.json") + " (n_embd / n_head = 8)");
    fs::remove(ws.path("config.json"));
    REQUIRE(
        run("generate --weights " + ws.path("w.safetensors") + " --head-dim 8" + greedy).output ==
        from_checkpoint.output);

    // Tokens are printed as they come: the first ones arrive while a long generation (100000
    // tokens, a minute at least) still runs; printed at the end, they would come only once
    // the process had ended.
    FILE* pipe = popen(("echo $$; exec " + std::string(TRIDENT_BINARY) + " generate --checkpoint " +
                        ws.path("ck") + " --prompt aaa --tokens 100000 --temperature 0 --threads 1")
                           .c_str(),
                       "r");
    REQUIRE(pipe != nullptr);
    char line[32] = {};
    REQUIRE(std::fgets(line, sizeof line, pipe) != nullptr);
    const pid_t pid = std::stoi(line);
    char first[10] = {};
    REQUIRE(std::fread(first, 1, sizeof first, pipe) == sizeof first);
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    const std::string state{std::istreambuf_iterator<char>(stat), {}};
    CHECK(std::string(first, sizeof first) == std::string(10, 'a'));
    const bool running = state.find(") R ") != std::string::npos ||
                         state.find(") S ") != std::string::npos;  // not Z: not yet ended
    CHECK(running);
    ::kill(pid, SIGKILL);
    pclose(pipe);
    // Bounded counts, and a temperature of 0 (greedy) or above.
    require_clear_error(run("generate --checkpoint " + ws.path("ck") + " --tokens 100001"),
                        "--tokens must be in [1, 100000], got 100001");
    for (const char* t : {"-1", "nan", "inf"})
        require_clear_error(
            run("generate --checkpoint " + ws.path("ck") + " --temperature " + t),
            std::string("--temperature must be 0 (greedy: the likeliest token) or a positive "
                        "number, got ") +
                t);

    require_clear_error(run("generate --prompt x"), "--weights");
    require_clear_error(run("generate --weights " + ws.path("none.safetensors") + " --prompt x"),
                        "none.safetensors");
}

TEST_CASE("tokenize: a vocabulary beyond 16 bits is written as int32 Megatron ids",
          "[cli][tokenize]") {
    Workspace ws;
    // tests/small_tokenizer_json.h's file with 69740 more tokens that no merge makes, so its
    // two added tokens move to ids 70000 (<|endoftext|>) and 70001 (<s>).
    std::string json = small_tokenizer::json();
    std::string more;
    for (int id = 260; id < 70000; ++id)
        more += ", \"w" + std::to_string(id) + "\": " + std::to_string(id);
    const auto replace = [&](const std::string& from, const std::string& to) {
        const std::size_t at = json.find(from);
        REQUIRE(at != std::string::npos);
        json.replace(at, from.size(), to);
    };
    replace("\"xyz\": 259", "\"xyz\": 259" + more);
    replace("{\"id\": 260, \"content\": \"<|endoftext|>\"",
            "{\"id\": 70000, \"content\": \"<|endoftext|>\"");
    replace("{\"id\": 261, \"content\": \"<s>\"", "{\"id\": 70001, \"content\": \"<s>\"");
    replace("\"ids\": [261]", "\"ids\": [70001]");
    const auto tokenizer = ws.write("big.json", json);
    const auto in = ws.write("t.txt", "abab a");
    const RunResult r = run("tokenize --no-progress --format megatron --tokenizer " + tokenizer +
                            " --output " + ws.path("m") + " " + in);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const trident::data::MegatronDataset meg(ws.path("m"), 70002, "test");
    CHECK(meg.dtype() == trident::kernels::DType::i32);
    // <s>, "abab" (ignore_merges: a whole piece in the vocabulary), " a", <|endoftext|>.
    CHECK(read_all(meg) == std::vector<int32_t>{70001, 258, 257, 70000});
    require_clear_error(run("tokenize --no-progress --tokenizer " + tokenizer + " --output " +
                            ws.path("s.bin") + " " + in),
                        "use --format megatron");
}
