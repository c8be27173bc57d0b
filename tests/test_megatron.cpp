// Megatron-LM indexed datasets: the writer against bytes laid out by hand from the format's
// description, the reader against the writer, every kind of corruption, format detection,
// and the sampling contract holding for a Megatron dataset as for an llm.c shard.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <vector>

#include "data/dataset.h"
#include "data/megatron_dataset.h"
#include "data/sampler.h"
#include "data/token_shards.h"
#include "kernels/error.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace trident;

namespace {

std::vector<unsigned char> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
}

// Little-endian bytes of an integer, appended: how the index is laid out by hand below.
template <typename T>
void put(std::vector<unsigned char>& out, T v) {
    for (std::size_t b = 0; b < sizeof(T); ++b)
        out.push_back(static_cast<unsigned char>(static_cast<uint64_t>(v) >> (8 * b)));
}

// An index laid out from the format description alone (not by our writer).
std::vector<unsigned char> hand_index(uint8_t dtype, const std::vector<int32_t>& lengths,
                                      const std::vector<int64_t>& pointers,
                                      const std::vector<int64_t>& docs) {
    std::vector<unsigned char> out = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    put<uint64_t>(out, 1);
    put<uint8_t>(out, dtype);
    put<uint64_t>(out, lengths.size());
    put<uint64_t>(out, docs.size());
    for (int32_t v : lengths) put(out, v);
    for (int64_t v : pointers) put(out, v);
    for (int64_t v : docs) put(out, v);
    return out;
}

// Documents of the given lengths, token ids counting up from `first` (mod `modulo`).
std::vector<std::vector<uint16_t>> make_documents(const std::vector<std::size_t>& lengths,
                                                  uint16_t first, uint16_t modulo) {
    std::vector<std::vector<uint16_t>> docs;
    uint32_t next = first;
    for (std::size_t n : lengths) {
        std::vector<uint16_t> d(n);
        for (uint16_t& t : d) t = static_cast<uint16_t>(next++ % modulo);
        docs.push_back(d);
    }
    return docs;
}

void write_megatron(const std::string& prefix, const std::vector<std::vector<uint16_t>>& docs) {
    data::MegatronWriter writer(prefix);
    for (const auto& d : docs) writer.add_document(d);
    writer.finish();
}

std::vector<int32_t> whole_stream(const data::TokenStream& s) {
    std::vector<int32_t> out(s.size());
    s.read(0, out);
    return out;
}

}  // namespace

TEST_CASE("megatron: the writer lays out the bytes the format describes", "[data][megatron]") {
    TempDir tmp("megatron");
    write_megatron(tmp / "d", {{1, 2, 3}, {4, 5}, {}, {65535}});
    // uint16 (code 8); 4 sequences; document index 0..4; sequences back to back from byte 0.
    const auto idx = hand_index(8, {3, 2, 0, 1}, {0, 6, 10, 10}, {0, 1, 2, 3, 4});
    CHECK(read_bytes(tmp / "d.idx") == idx);
    CHECK(read_bytes(tmp / "d.bin") ==
          std::vector<unsigned char>{1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 0xff, 0xff});
    CHECK(idx.size() == 34 + 4 * 4 + 8 * 4 + 8 * 5);
    // Nothing left under temporary names.
    CHECK_FALSE(fs::exists(tmp / "d.bin.tmp"));
    CHECK_FALSE(fs::exists(tmp / "d.idx.tmp"));
}

TEST_CASE("megatron: the stream is every sequence in order", "[data][megatron]") {
    TempDir tmp("megatron");
    const auto docs = make_documents({7, 1, 0, 250, 3, 64}, 10, 1000);
    write_megatron(tmp / "d", docs);
    const data::MegatronDataset ds(tmp / "d", 1000, "data.train");
    std::vector<int32_t> expected;
    for (const auto& d : docs) expected.insert(expected.end(), d.begin(), d.end());
    CHECK(ds.size() == expected.size());
    CHECK(ds.sequences() == 6);
    CHECK(ds.documents() == 6);
    CHECK(ds.dtype() == kernels::DType::u16);
    CHECK(whole_stream(ds) == expected);
    std::vector<int32_t> part(12);
    ds.read(2, part);  // crosses from the first document into the fourth
    CHECK(std::equal(part.begin(), part.end(), expected.begin() + 2));
    CHECK(ds.describe() == "Megatron dataset " + (tmp / "d") + " (6 documents, uint16)");
}

TEST_CASE("megatron: int32 tokens and documents of several sequences, laid out by hand",
          "[data][megatron]") {
    TempDir tmp("megatron");
    // Two documents: sequences {0, 1} and {2}; tokens 70000.. need more than 16 bits.
    write_bytes(tmp / "h.idx", hand_index(4, {2, 3, 1}, {0, 8, 20}, {0, 2, 3}));
    std::vector<unsigned char> bin;
    for (int32_t t = 70000; t < 70006; ++t) put(bin, t);
    write_bytes(tmp / "h.bin", bin);
    const data::MegatronDataset ds(tmp / "h", 80000, "data.train");
    CHECK(ds.sequences() == 3);
    CHECK(ds.documents() == 2);
    CHECK(whole_stream(ds) == std::vector<int32_t>{70000, 70001, 70002, 70003, 70004, 70005});

    // An empty dataset is well formed (and too small to sample from, which the sampler says).
    write_bytes(tmp / "e.idx", hand_index(8, {}, {}, {0}));
    write_bytes(tmp / "e.bin", {});
    const data::MegatronDataset empty(tmp / "e", 10, "data.train");
    CHECK(empty.size() == 0);
    REQUIRE_THROWS_WITH(data::Sampler(empty, 4, false, 1, "data.train"),
                        Catch::Contains("too few"));
}

TEST_CASE("megatron: corrupt datasets are refused naming the file", "[data][megatron][bad-input]") {
    TempDir tmp("megatron");
    const std::string p = tmp / "c";
    write_megatron(p, make_documents({5, 3, 8}, 0, 50));
    const auto idx = read_bytes(p + ".idx");
    const auto bin = read_bytes(p + ".bin");

    // Writes the dataset with `edit` applied to copies of its files, expects `message`.
    auto refused =
        [&](const std::function<void(std::vector<unsigned char>&, std::vector<unsigned char>&)>&
                edit,
            const std::string& message, int vocab = 50) {
            auto i = idx, b = bin;
            edit(i, b);
            write_bytes(p + ".idx", i);
            write_bytes(p + ".bin", b);
            REQUIRE_THROWS_WITH(data::MegatronDataset(p, vocab, "data.train"),
                                Catch::Contains(message));
        };
    const std::string idx_name = p + ".idx: ", bin_name = p + ".bin: ";
    using Bytes = std::vector<unsigned char>;

    SECTION("truncated index") {
        refused([](Bytes& i, Bytes&) { i.resize(i.size() - 8); },
                idx_name +
                    "header says 3 sequences and 4 document-index entries (102 bytes) but "
                    "the file has 94 bytes: truncated or corrupt");
        refused([](Bytes& i, Bytes&) { i.resize(20); },
                idx_name + "20 bytes is shorter than the 34-byte Megatron index header");
    }
    SECTION("truncated data") {
        refused([](Bytes&, Bytes& b) { b.resize(b.size() - 2); },
                bin_name + "30 bytes, but " + p +
                    ".idx places sequence 2 up to byte 32: "
                    "truncated or corrupt");
        refused([](Bytes&, Bytes& b) { b.push_back(0); }, bin_name + "33 bytes, but");
    }
    SECTION("bad magic") {
        refused([](Bytes& i, Bytes&) { i[0] = 'X'; }, idx_name + "not a Megatron index");
    }
    SECTION("bad version") {
        refused([](Bytes& i, Bytes&) { i[9] = 2; },
                idx_name + "unsupported Megatron index version 2 (expected 1)");
    }
    SECTION("unsupported dtype") {
        refused([](Bytes& i, Bytes&) { i[17] = 7; }, idx_name + "dtype float32 holds no token ids");
        refused([](Bytes& i, Bytes&) { i[17] = 9; }, idx_name + "unknown dtype code 9");
    }
    SECTION("pointers out of range or not back to back") {
        // Sequence 1's pointer: after the header and three lengths, the second int64.
        const std::size_t second_pointer = 34 + 3 * 4 + 8;
        refused([&](Bytes& i, Bytes&) { i[second_pointer] = 200; },
                idx_name + "sequence 1 starts at byte 200, outside " + p + ".bin (32 bytes)");
        refused([&](Bytes& i, Bytes&) { i[second_pointer] = 12; },
                idx_name +
                    "sequence 1 starts at byte 12 but the sequences before it end at byte "
                    "10");
        refused([&](Bytes& i, Bytes&) { i[34 + 4 + 3] = 0x80; },  // length of sequence 1 < 0
                idx_name + "sequence 1 has a negative length");
    }
    SECTION("document index") {
        const std::size_t docs = 34 + 3 * 4 + 3 * 8;
        refused([&](Bytes& i, Bytes&) { i[docs] = 1; },
                idx_name + "the document index starts at 1, not 0");
        refused([&](Bytes& i, Bytes&) { i[docs + 16] = 0; },
                idx_name + "the document index decreases at entry 2 (0 after 1)");
        refused([&](Bytes& i, Bytes&) { i[docs + 24] = 2; },
                idx_name + "the document index ends at 2, not at the number of sequences (3)");
    }
    SECTION("a multimodal index") {
        refused([](Bytes& i, Bytes&) { i.insert(i.end(), {0, 0, 0}); }, "a multimodal dataset");
    }
    SECTION("token outside the vocabulary") {
        refused([](Bytes&, Bytes& b) { b[2 * 9] = 50; },
                bin_name +
                    "token id 50 at position 9 is outside the vocabulary (model.vocab_size = "
                    "50)");
        refused([](Bytes&, Bytes&) {}, bin_name + "token id 10 at position 10", 10);
    }
    SECTION("missing files") {
        fs::remove(p + ".bin");
        REQUIRE_THROWS_WITH(
            data::MegatronDataset(p, 50, "data.train"),
            "data.train: " + p + ".bin: cannot open: No such file or directory (ENOENT)");
        REQUIRE_THROWS_WITH(data::MegatronDataset(tmp / "none", 50, "data.train"),
                            Catch::Contains("none.idx"));
    }
}

TEST_CASE("megatron: format detection", "[data][megatron]") {
    TempDir tmp("megatron");
    write_megatron(tmp / "m", make_documents({40}, 0, 100));
    data::write_token_shard(tmp / "s.bin", make_documents({40}, 0, 100)[0]);
    data::write_token_shard(tmp / "part_0.bin", make_documents({40}, 0, 100)[0]);
    data::write_token_shard(tmp / "part_1.bin", make_documents({40}, 0, 100)[0]);

    for (const std::string& given : {tmp / "m", tmp / "m.bin", tmp / "m.idx"}) {
        INFO(given);
        const data::LocatedStream found = data::detect_format(given);
        CHECK(found.format == data::StreamFormat::megatron);
        CHECK(found.path == tmp / "m");
    }
    for (const std::string& given : {tmp / "s.bin", tmp / "part_*.bin", tmp / "none.bin"}) {
        INFO(given);
        const data::LocatedStream found = data::detect_format(given);
        CHECK(found.format == data::StreamFormat::llmc);
        CHECK(found.path == given);
    }

    using config::DataFormat;
    CHECK(data::open_stream(tmp / "m.idx", DataFormat::auto_, 100, "data.train")->size() == 40);
    CHECK(data::open_stream(tmp / "part_*.bin", DataFormat::auto_, 100, "data.train")->size() ==
          80);
    CHECK(data::open_stream(tmp / "m.bin", DataFormat::megatron, 100, "data.train")->size() == 40);
    // A format forced by data.format is taken at its word.
    REQUIRE_THROWS_WITH(
        data::open_stream(tmp / "m.bin", DataFormat::llmc, 100, "data.train"),
        Catch::Contains("m.bin: 80 bytes is shorter than the 1024-byte llm.c shard"));
    REQUIRE_THROWS_WITH(data::open_stream(tmp / "s.bin", DataFormat::megatron, 100, "data.train"),
                        Catch::Contains((tmp / "s.idx") + ": cannot open"));
}

TEST_CASE("megatron: the sampling contract holds as for a shard of the same tokens",
          "[data][megatron]") {
    TempDir tmp("megatron");
    const auto docs = make_documents({100, 37, 1, 0, 250, 19}, 3, 500);
    std::vector<uint16_t> all;
    for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
    write_megatron(tmp / "m", docs);
    data::write_token_shard(tmp / "s.bin", all);
    const data::MegatronDataset megatron(tmp / "m", 500, "data.train");
    const data::TokenShards shard(tmp / "s.bin", 500, "data.train");

    const int T = 16;
    const std::size_t W = (all.size() - 1) / T;
    for (bool shuffle : {false, true}) {
        data::Sampler a(megatron, T, shuffle, 99, "data.train"),
            b(shard, T, shuffle, 99, "data.train");
        REQUIRE(a.windows() == W);
        std::vector<int32_t> in_a(T), tgt_a(T), in_b(T), tgt_b(T);
        for (uint64_t k = 0; k < 3 * W; ++k) {
            a.fill(k, in_a, tgt_a);
            b.fill(k, in_b, tgt_b);
            REQUIRE(in_a == in_b);
            REQUIRE(tgt_a == tgt_b);
            if (!shuffle) {  // window (k mod W)·T, targets shifted by one
                const std::size_t start = (k % W) * T;
                REQUIRE(in_a[0] == all[start]);
                REQUIRE(tgt_a[T - 1] == all[start + T]);
            }
        }
    }
}

TEST_CASE("megatron: an int32 writer lays out the bytes the format describes", "[data][megatron]") {
    TempDir tmp("megatron");
    data::MegatronWriter writer(tmp / "w", kernels::DType::i32);
    writer.add_document(std::vector<int32_t>{70000, 1});
    writer.add_document(std::vector<int32_t>{128255});
    writer.finish();
    // int32 (code 4); sequences at bytes 0 and 8.
    CHECK(read_bytes(tmp / "w.idx") == hand_index(4, {2, 1}, {0, 8}, {0, 1, 2}));
    std::vector<unsigned char> bin;
    for (int32_t t : {70000, 1, 128255}) put(bin, t);
    CHECK(read_bytes(tmp / "w.bin") == bin);
    const data::MegatronDataset ds(tmp / "w", 128256, "data.train");
    CHECK(whole_stream(ds) == std::vector<int32_t>{70000, 1, 128255});
    // A uint16 writer names an id it cannot hold.
    data::MegatronWriter narrow(tmp / "n");
    CHECK_THROWS_WITH(narrow.add_document(std::vector<int32_t>{65536}),
                      Catch::Contains("token id 65536 does not fit the uint16"));
}
