// TensorBoard event files: TFRecord framing and Event protocol buffers (see tensorboard.h).
#include "io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "kernels/error.h"

namespace trident::io {

namespace {

// The table of the reflected Castagnoli polynomial, one entry per byte value.
const std::array<uint32_t, 256>& crc_table() {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    return table;
}

void put_le(std::string& out, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}

// Protocol-buffer wire format: a varint, and a field's key (its number and wire type).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
    while (value >= 0x80) {
        out.push_back(static_cast<char>((value & 0x7F) | 0x80));
        value >>= 7;
    }
    out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) {
    put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
    put_key(out, field, kLengthDelimited);
    put_varint(out, bytes.size());
    out.append(bytes);
}

void put_double(std::string& out, uint32_t field, double value) {
    uint64_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    put_key(out, field, kFixed64);
    put_le(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    put_key(out, field, kFixed32);
    put_le(out, bits, 4);
}

// Event's fields (event.proto) and Summary's (summary.proto).
constexpr uint32_t kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;

// An Event's wall_time and step (the step only when non-zero: proto3 leaves defaults out).
std::string event_head(double wall_time, int64_t step) {
    std::string event;
    put_double(event, kWallTime, wall_time);
    if (step != 0) {
        put_key(event, kStep, kVarint);
        put_varint(event, static_cast<uint64_t>(step));
    }
    return event;
}

double seconds_since_epoch() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

}  // namespace

uint32_t crc32c(const void* data, std::size_t size) {
    const auto& table = crc_table();
    const auto* p = static_cast<const unsigned char*>(data);
    uint32_t crc = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, std::size_t size) {
    const uint32_t crc = crc32c(data, size);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view payload) {
    std::string record;
    put_le(record, payload.size(), 8);
    put_le(record, masked_crc32c(record.data(), 8), 4);
    record.append(payload);
    put_le(record, masked_crc32c(payload.data(), payload.size()), 4);
    return record;
}

std::string scalar_event(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars) {
    std::string summary;
    for (const auto& [tag, value] : scalars) {
        std::string v;
        put_bytes(v, kValueTag, tag);
        put_float(v, kValueSimpleValue, static_cast<float>(value));
        put_bytes(summary, kSummaryValue, v);
    }
    std::string event = event_head(wall_time, step);
    put_bytes(event, kSummary, summary);
    return event;
}

EventWriter::EventWriter(const std::string& dir) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
    const double now = seconds_since_epoch();
    const std::filesystem::path path =
        std::filesystem::path(dir) /
        ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host);
    try {
        std::filesystem::create_directories(dir);
    } catch (const std::filesystem::filesystem_error& e) {
        throw Error(dir + ": cannot create the directory: " + errno_text(e.code().value()));
    }
    file_ = std::make_unique<OutputFile>(path.string());
    std::string event = event_head(now, 0);
    put_bytes(event, kFileVersion, "brain.Event:2");
    file_->write_record(tfrecord(event));
}

void EventWriter::scalars(int64_t step,
                          const std::vector<std::pair<std::string, double>>& scalars) {
    file_->write_record(tfrecord(scalar_event(seconds_since_epoch(), step, scalars)));
}

}  // namespace trident::io
