// trident_tokenize_ids: runs the GPT-2 tokenizer (data/gpt2_tokenizer.h), or with --json a
// tokenizer.json (data/hf_tokenizer.h), on a file, for the comparisons with the JavaScript
// encoders (tests/python/test_tokenizer_js.py, test_tokenizer_json.py) and the benchmark
// (scripts/bench_tokenizer.sh). Ids are the text's alone, without a post-processor's tokens.
//
//   trident_tokenize_ids FILE            the ids of the whole file, as one JSON array; exits 1
//                                        if decoding them does not give the file back
//   trident_tokenize_ids --strings FILE  FILE is a JSON array of strings: one JSON array of
//                                        ids per string, one per line
//   trident_tokenize_ids --bench FILE    times encode() alone, on one thread (best of
//                                        --repeat runs), and prints one JSON line with MB/s
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "io/json_reader.h"
#include "kernels/error.h"

using namespace trident;

static std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open");
    std::ostringstream text;
    text << in.rdbuf();
    return std::move(text).str();
}

static void print_ids(const std::vector<int32_t>& ids) {
    std::string line = "[";
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i) line += ',';
        line += std::to_string(ids[i]);
    }
    line += "]\n";
    std::fwrite(line.data(), 1, line.size(), stdout);
}

// The first byte where a and b differ (or the shorter's length).
static std::size_t first_difference(const std::string& a, const std::string& b) {
    return static_cast<std::size_t>(
        std::mismatch(a.begin(), a.begin() + std::min(a.size(), b.size()), b.begin()).first -
        a.begin());
}

// Tok: data::Gpt2Tokenizer or data::Tokenizer, which encode and decode alike.
template <typename Tok>
static int run(const Tok& tokenizer, const std::string& path, bool strings, bool bench,
               int repeat) {
    const std::string text = read_file(path);
    if (strings) {
        const io::json::Value list = io::json::parse(text);
        if (!list.is_array()) throw Error(path + ": expected a JSON array of strings");
        for (const io::json::Value& s : list.array) {
            if (!s.is_string()) throw Error(path + ": expected a JSON array of strings");
            std::vector<int32_t> ids;
            tokenizer.encode(s.string, ids);
            print_ids(ids);
        }
        return 0;
    }
    std::vector<int32_t> ids;
    if (bench) {
        // The first run fills the piece cache, as the first megabytes of a corpus would.
        double best = 1e30;
        for (int r = 0; r < repeat; ++r) {
            ids.clear();
            const auto t0 = std::chrono::steady_clock::now();
            tokenizer.encode(text, ids);
            const auto t1 = std::chrono::steady_clock::now();
            best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
        }
        std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f, \"mb_per_s\": %.3f}\n",
                    text.size(), ids.size(), best, static_cast<double>(text.size()) / 1e6 / best);
        return 0;
    }
    tokenizer.encode(text, ids);
    const std::string back = tokenizer.decode(ids);
    if (back != text) {
        std::fprintf(stderr, "trident_tokenize_ids: decode(encode(%s)) differs at byte %zu\n",
                     path.c_str(), first_difference(back, text));
        return 1;
    }
    print_ids(ids);
    return 0;
}

int main(int argc, char** argv) {
    CLI::App app{"Runs the GPT-2 tokenizer on a file: its ids, or its speed"};
    std::string dir = data::default_tokenizer_dir(), json, path;
    bool strings = false, bench = false;
    int repeat = 3;
    app.add_option("--dir", dir, "directory with encoder.json and vocab.bpe")
        ->capture_default_str();
    app.add_option("--json", json, "a tokenizer.json to run instead of GPT-2's files");
    app.add_flag("--strings", strings, "FILE is a JSON array of strings; ids per string");
    app.add_flag("--bench", bench, "time encode() only and print MB/s");
    app.add_option("--repeat", repeat, "runs timed with --bench (the best counts)")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("file", path, "input file")->required();
    CLI11_PARSE(app, argc, argv);
    try {
        if (!json.empty()) return run(*data::make_hf_tokenizer(json), path, strings, bench, repeat);
        return run(data::Gpt2Tokenizer(dir), path, strings, bench, repeat);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "trident_tokenize_ids: %s\n", e.what());
        return 1;
    }
}
