// Megatron-LM indexed datasets (the "MMIDIDX" format of preprocess_data.py), read as one token
// stream and written for tools and tests.
//
// Layout, as megatron/core/datasets/indexed_dataset.py (_IndexWriter, _IndexReader) writes
// and reads it; every integer little-endian:
//
//   PREFIX.idx   magic   9 bytes  "MMIDIDX\0\0"
//                version u64      1
//                dtype   u8       token type code: 1 uint8, 2 int8, 3 int16, 4 int32,
//                                 5 int64, 6 float64, 7 float32, 8 uint16
//                n       u64      number of sequences
//                d       u64      length of the document index (documents + 1)
//                lengths int32[n] tokens in each sequence
//                pointer int64[n] byte offset of each sequence in PREFIX.bin
//                docs    int64[d] sequence index where each document starts: 0 first, n last
//   PREFIX.bin   the sequences' tokens back to back
//
// The stream is the concatenation of all sequences in index order. Megatron's builder writes
// them contiguously from byte 0, and we insist on that, so the stream is simply PREFIX.bin
// read front to back; the index is checked in full when opened and then let go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/token_stream.h"
#include "io/output_file.h"
#include "kernels/dtype.h"

namespace trident::data {

inline constexpr char kMegatronMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMegatronVersion = 1;
inline constexpr std::size_t kMegatronHeaderBytes = 9 + 8 + 1 + 8 + 8;  // 34

class MegatronDataset : public TokenStream {
public:
    // Opens PREFIX.idx and PREFIX.bin and checks them in full (header, sizes, pointers,
    // document index, every token id below vocab_size); `what` names the config key in
    // messages. Throws trident::Error naming the file at fault.
    MegatronDataset(const std::string& prefix, int vocab_size, const std::string& what);
    MegatronDataset(const MegatronDataset&) = delete;
    MegatronDataset& operator=(const MegatronDataset&) = delete;

    std::size_t size() const override { return tokens_; }
    void read(std::size_t start, std::span<int32_t> out) const override;
    std::string describe() const override;
    std::vector<std::string> files() const override { return {prefix_ + ".idx", prefix_ + ".bin"}; }

    const std::string& prefix() const { return prefix_; }
    kernels::DType dtype() const { return dtype_; }  // of the token ids
    std::size_t sequences() const { return sequences_; }
    std::size_t documents() const { return documents_; }

private:
    std::string prefix_;
    kernels::DType dtype_ = kernels::DType::u16;
    std::size_t sequences_ = 0;
    std::size_t documents_ = 0;
    std::size_t tokens_ = 0;
    MappedFile bin_;  // PREFIX.bin; data() is null when it is empty
    int vocab_size_;
    std::string what_;
};

// Writes a Megatron dataset of uint16 or int32 tokens (Megatron-LM takes int32 once a
// vocabulary outgrows 16 bits), one sequence per document. The files appear
// under their final names only when finish() succeeds (written as *.tmp, then renamed), so
// a crash never leaves a half-written dataset that looks whole.
class MegatronWriter {
public:
    // PREFIX.bin and PREFIX.idx are written under temporary names and renamed into place by
    // finish(), so a run reading the old ones keeps them whole (io::ReplacingFile).
    // `dtype`: u16 or i32.
    explicit MegatronWriter(const std::string& prefix, kernels::DType dtype = kernels::DType::u16);
    ~MegatronWriter();  // removes the temporary files unless finish() ran
    MegatronWriter(const MegatronWriter&) = delete;
    MegatronWriter& operator=(const MegatronWriter&) = delete;

    void add_document(std::span<const uint16_t> tokens);
    // Ids out of the dtype's range are an error naming the id.
    void add_document(std::span<const int32_t> tokens);
    // Writes PREFIX.idx and closes both files, not yet under their names.
    void close();
    // Renames PREFIX.bin, then PREFIX.idx, into place (closing them first, unless it was).
    void commit();
    void finish() { commit(); }

    std::size_t documents() const { return lengths_.size(); }

private:
    void append(const void* tokens, std::size_t count);

    std::string prefix_;
    kernels::DType dtype_;
    io::ReplacingFile bin_;
    std::unique_ptr<io::ReplacingFile> idx_;  // made by close()
    std::vector<int32_t> lengths_;
    bool finished_ = false;
};

// Formats of a dataset path, and the detector for data.format: auto.
enum class StreamFormat { llmc, megatron };

struct LocatedStream {
    StreamFormat format;
    std::string path;  // llmc: the path or glob as given; megatron: the prefix
};

// PREFIX, PREFIX.bin or PREFIX.idx where both PREFIX.bin and PREFIX.idx exist is a Megatron
// dataset (named by its prefix); anything else is taken as llm.c shards (a path or a glob).
LocatedStream detect_format(const std::string& path);

// The prefix a user meant by "PREFIX", "PREFIX.bin" or "PREFIX.idx".
std::string megatron_prefix(const std::string& path);

}  // namespace trident::data
