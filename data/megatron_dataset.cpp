// Reading and writing Megatron-LM indexed datasets (see megatron_dataset.h for the layout).
#include "data/megatron_dataset.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "kernels/error.h"

namespace trident::data {

// The format is little-endian, and we read its integers with memcpy.
static_assert(std::endian::native == std::endian::little, "Megatron datasets are little-endian");

namespace {

// A little-endian integer at any byte offset (the index's arrays start at byte 34, so they
// are not aligned for their type).
template <typename T>
T load(const unsigned char* at) {
    T v;
    std::memcpy(&v, at, sizeof v);
    return v;
}

// The index's dtype codes (Megatron-LM's indexed_dataset.py, class DType) as element
// types, with the names Megatron gives them.
struct DtypeCode {
    uint8_t code;
    kernels::DType dtype;
    const char* name;
};
constexpr DtypeCode kDtypeCodes[] = {
    {1, kernels::DType::u8, "uint8"},    {2, kernels::DType::i8, "int8"},
    {3, kernels::DType::i16, "int16"},   {4, kernels::DType::i32, "int32"},
    {5, kernels::DType::i64, "int64"},   {6, kernels::DType::f64, "float64"},
    {7, kernels::DType::f32, "float32"}, {8, kernels::DType::u16, "uint16"},
};

const DtypeCode* find_code(uint8_t code) {
    for (const DtypeCode& c : kDtypeCodes)
        if (c.code == code) return &c;
    return nullptr;
}
const DtypeCode& code_of(kernels::DType dtype) {
    for (const DtypeCode& c : kDtypeCodes)
        if (c.dtype == dtype) return c;
    throw Error(std::string("internal: no Megatron dtype code for ") + kernels::name_of(dtype));
}

// Calls f(const T*) with the tokens typed as the dataset's integer dtype.
template <typename F>
void with_tokens(kernels::DType dtype, const void* tokens, F&& f) {
    using kernels::DType;
    switch (dtype) {
        case DType::u8:
            return f(static_cast<const uint8_t*>(tokens));
        case DType::i8:
            return f(static_cast<const int8_t*>(tokens));
        case DType::i16:
            return f(static_cast<const int16_t*>(tokens));
        case DType::u16:
            return f(static_cast<const uint16_t*>(tokens));
        case DType::i32:
            return f(static_cast<const int32_t*>(tokens));
        case DType::i64:
            return f(static_cast<const int64_t*>(tokens));
        default:
            throw Error("internal: Megatron dtype without tokens");
    }
}

bool is_file(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string str(std::size_t v) {
    return std::to_string(v);
}

// The index's header: the tokens' type and the counts of sequences (n) and document-index
// entries (d), checked against the index's length.
struct IndexHeader {
    const DtypeCode* code;
    uint64_t n, d;
};
IndexHeader read_header(const std::string& idx_path, const MappedFile& index) {
    const unsigned char* idx = index.data();
    const std::size_t idx_bytes = index.bytes();
    if (idx_bytes < kMegatronHeaderBytes)
        throw Error(idx_path + ": " + str(idx_bytes) + " bytes is shorter than the " +
                    str(kMegatronHeaderBytes) + "-byte Megatron index header (truncated?)");
    if (std::memcmp(idx, kMegatronMagic, sizeof kMegatronMagic) != 0)
        throw Error(idx_path + ": not a Megatron index (it does not start with \"MMIDIDX\\0\\0\")");
    const uint64_t version = load<uint64_t>(idx + 9);
    if (version != kMegatronVersion)
        throw Error(idx_path + ": unsupported Megatron index version " + std::to_string(version) +
                    " (expected 1)");
    const uint8_t code = idx[17];
    const DtypeCode* known = find_code(code);
    if (!known)
        throw Error(idx_path + ": unknown dtype code " + std::to_string(code) +
                    " (Megatron's codes are 1 to 8)");
    if (known->dtype == kernels::DType::f32 || known->dtype == kernels::DType::f64)
        throw Error(idx_path + ": dtype " + known->name +
                    " holds no token ids (supported: uint8, int8, int16, uint16, int32, int64)");
    const uint64_t n = load<uint64_t>(idx + 18);
    const uint64_t d = load<uint64_t>(idx + 26);

    // The index's length follows from n and d; guard the products against overflow first.
    const bool fits = n <= idx_bytes / 12 && d <= idx_bytes / 8;
    const std::size_t expected = fits ? kMegatronHeaderBytes + 12 * n + 8 * d : 0;
    if (!fits || expected != idx_bytes) {
        const std::string header = idx_path + ": header says " + std::to_string(n) +
                                   " sequences and " + std::to_string(d) +
                                   " document-index entries";
        if (fits && expected + n == idx_bytes)
            throw Error(header + " and the file has one mode byte per sequence after them: a " +
                        "multimodal dataset, which holds more than tokens (not supported)");
        throw Error(header + " (" + (fits ? str(expected) + " bytes" : "more bytes than that") +
                    ") but the file has " + str(idx_bytes) + " bytes: truncated or corrupt");
    }
    return {known, n, d};
}

// Sequences: non-negative lengths (int32[n]) at `pointers` (int64[n]), stored back to back
// from byte 0 of the .bin and filling it.
void check_sequences(const std::string& idx_path, const std::string& bin_path,
                     const unsigned char* lengths, const unsigned char* pointers, uint64_t n,
                     const DtypeCode& code, std::size_t bin_bytes) {
    const std::size_t size = kernels::size_of(code.dtype);
    std::size_t end = 0;  // where the sequences so far end in the .bin
    for (std::size_t i = 0; i < n; ++i) {
        const int32_t length = load<int32_t>(lengths + 4 * i);
        const int64_t pointer = load<int64_t>(pointers + 8 * i);
        if (length < 0)
            throw Error(idx_path + ": sequence " + str(i) + " has a negative length (" +
                        std::to_string(length) + ")");
        if (pointer < 0 || static_cast<uint64_t>(pointer) > bin_bytes)
            throw Error(idx_path + ": sequence " + str(i) + " starts at byte " +
                        std::to_string(pointer) + ", outside " + bin_path + " (" + str(bin_bytes) +
                        " bytes)");
        if (static_cast<uint64_t>(pointer) != end)
            throw Error(idx_path + ": sequence " + str(i) + " starts at byte " +
                        std::to_string(pointer) + " but the sequences before it end at byte " +
                        str(end) + " (sequences must be stored back to back, as Megatron " +
                        "writes them)");
        end += static_cast<std::size_t>(length) * size;
        if (end > bin_bytes)
            throw Error(bin_path + ": " + str(bin_bytes) + " bytes, but " + idx_path +
                        " places sequence " + str(i) + " up to byte " + str(end) +
                        ": truncated or corrupt");
    }
    if (end != bin_bytes)
        throw Error(bin_path + ": " + str(bin_bytes) + " bytes, but " + idx_path + " describes " +
                    str(end / size) + " " + code.name + " tokens (" + str(end) +
                    " bytes): extra data, or an index from another dataset");
}

// Document index (int64[d]): from 0 to n, never decreasing.
void check_documents(const std::string& idx_path, const unsigned char* docs, uint64_t d,
                     uint64_t n) {
    if (d == 0) throw Error(idx_path + ": the document index is empty (it holds at least 0)");
    int64_t previous = load<int64_t>(docs);
    if (previous != 0)
        throw Error(idx_path + ": the document index starts at " + std::to_string(previous) +
                    ", not 0");
    for (std::size_t j = 1; j < d; ++j) {
        const int64_t entry = load<int64_t>(docs + 8 * j);
        if (entry < previous)
            throw Error(idx_path + ": the document index decreases at entry " + str(j) + " (" +
                        std::to_string(entry) + " after " + std::to_string(previous) + ")");
        previous = entry;
    }
    if (static_cast<uint64_t>(previous) != n)
        throw Error(idx_path + ": the document index ends at " + std::to_string(previous) +
                    ", not at the number of sequences (" + std::to_string(n) + ")");
}

// Every token id inside the vocabulary, checked now rather than midway through a run.
void check_vocabulary(const std::string& bin_path, kernels::DType dtype, const void* data,
                      std::size_t count, int vocab_size) {
    if (count == 0) return;
    with_tokens(dtype, data, [&](const auto* tokens) {
        using T = std::remove_cv_t<std::remove_pointer_t<decltype(tokens)>>;
        for (std::size_t i = 0; i < count; ++i) {
            bool outside = static_cast<int64_t>(tokens[i]) >= vocab_size;
            if constexpr (std::is_signed_v<T>) outside = outside || tokens[i] < 0;
            if (outside)
                throw Error(bin_path + ": token id " + std::to_string(tokens[i]) + " at position " +
                            str(i) + " is outside the vocabulary (model.vocab_size = " +
                            std::to_string(vocab_size) + ")");
        }
    });
}

}  // namespace

MegatronDataset::MegatronDataset(const std::string& prefix, int vocab_size, const std::string& what)
    : prefix_(prefix), vocab_size_(vocab_size), what_(what) {
    const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
    const MappedFile index(idx_path, what);
    MappedFile bin(bin_path, what);
    const IndexHeader header = read_header(idx_path, index);
    const uint64_t n = header.n, d = header.d;
    const unsigned char* lengths = index.data() + kMegatronHeaderBytes;  // int32[n]
    const unsigned char* pointers = lengths + 4 * n;                     // int64[n]
    const unsigned char* docs = pointers + 8 * n;                        // int64[d]
    check_sequences(idx_path, bin_path, lengths, pointers, n, *header.code, bin.bytes());
    check_documents(idx_path, docs, d, n);
    dtype_ = header.code->dtype;
    tokens_ = bin.bytes() / kernels::size_of(dtype_);
    check_vocabulary(bin_path, dtype_, bin.data(), tokens_, vocab_size);
    sequences_ = n;
    documents_ = d - 1;
    bin_ = std::move(bin);
}

void MegatronDataset::read(std::size_t start, std::span<int32_t> out) const {
    with_tokens(dtype_, bin_.data(), [&](const auto* tokens) {
        // Widened, and the ids outside the vocabulary counted in the same pass (no branch:
        // the loop vectorises); the first is found only when there is one.
        const uint32_t vocab = static_cast<uint32_t>(vocab_size_);
        uint32_t outside = 0;
        for (std::size_t i = 0; i < out.size(); ++i) {
            out[i] = static_cast<int32_t>(tokens[start + i]);
            outside |= static_cast<uint32_t>(out[i]) >= vocab;  // negative ids wrap above it
        }
        if (outside == 0) return;
        for (std::size_t i = 0; i < out.size(); ++i)
            if (static_cast<uint32_t>(out[i]) >= vocab)
                token_changed(what_, prefix_ + ".bin", (start + i) * sizeof(*tokens), out[i],
                              vocab_size_);
    });
}

std::string MegatronDataset::describe() const {
    return "Megatron dataset " + prefix_ + " (" + str(documents_) + " documents, " +
           code_of(dtype_).name + ")";
}

MegatronWriter::MegatronWriter(const std::string& prefix, kernels::DType dtype)
    : prefix_(prefix), dtype_(dtype), bin_(prefix + ".bin") {
    if (dtype != kernels::DType::u16 && dtype != kernels::DType::i32)
        throw Error(std::string("internal: Megatron writer of ") + kernels::name_of(dtype));
}

MegatronWriter::~MegatronWriter() = default;

void MegatronWriter::append(const void* tokens, std::size_t count) {
    if (finished_) throw Error(prefix_ + ": add_document after finish");
    if (count > static_cast<std::size_t>(std::numeric_limits<int32_t>::max()))
        throw Error(prefix_ + ": a document of " + str(count) +
                    " tokens is longer than a Megatron sequence length (int32) can say");
    bin_.write(tokens, count * kernels::size_of(dtype_));
    lengths_.push_back(static_cast<int32_t>(count));
}

void MegatronWriter::add_document(std::span<const uint16_t> tokens) {
    add_document(std::vector<int32_t>(tokens.begin(), tokens.end()));
}

void MegatronWriter::add_document(std::span<const int32_t> tokens) {
    const int64_t top = dtype_ == kernels::DType::u16 ? 65535 : std::numeric_limits<int32_t>::max();
    for (const int32_t t : tokens)
        if (t < 0 || t > top)
            throw Error(prefix_ + ": token id " + std::to_string(t) + " does not fit the " +
                        code_of(dtype_).name + " of this dataset");
    if (dtype_ == kernels::DType::i32) {
        append(tokens.data(), tokens.size());
        return;
    }
    const std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
    append(narrow.data(), narrow.size());
}

void MegatronWriter::close() {
    if (idx_) return;

    const uint64_t n = lengths_.size();
    std::vector<int64_t> pointers(n), docs(n + 1);
    int64_t at = 0;
    for (std::size_t i = 0; i < n; ++i) {
        pointers[i] = at;
        at += int64_t{lengths_[i]} * static_cast<int64_t>(kernels::size_of(dtype_));
    }
    for (std::size_t j = 0; j <= n; ++j) docs[j] = static_cast<int64_t>(j);  // one per document

    idx_ = std::make_unique<io::ReplacingFile>(prefix_ + ".idx");
    const uint8_t code = code_of(dtype_).code;
    const uint64_t d = n + 1;
    auto put = [&](const void* p, std::size_t bytes) { idx_->write(p, bytes); };
    put(kMegatronMagic, sizeof kMegatronMagic);
    put(&kMegatronVersion, 8);
    put(&code, 1);
    put(&n, 8);
    put(&d, 8);
    put(lengths_.data(), 4 * n);
    put(pointers.data(), 8 * n);
    put(docs.data(), 8 * d);
    bin_.close();
    idx_->close();
    lengths_ = {};
    finished_ = true;  // no document may follow
}

void MegatronWriter::commit() {
    close();
    // The data before the index that describes it: a reader never finds an index without it.
    bin_.commit();
    idx_->commit();
}

std::string megatron_prefix(const std::string& path) {
    if (path.ends_with(".bin") || path.ends_with(".idx")) return path.substr(0, path.size() - 4);
    return path;
}

LocatedStream detect_format(const std::string& path) {
    const std::string prefix = megatron_prefix(path);
    if (is_file(prefix + ".bin") && is_file(prefix + ".idx"))
        return {StreamFormat::megatron, prefix};
    return {StreamFormat::llmc, path};
}

}  // namespace trident::data
