// TensorBoard event files, written without TensorFlow or a protocol-buffer library: the
// records are framed as TFRecord and hold Event protocol buffers encoded by hand.
//
// A TFRecord file is a sequence of records, each
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//   length bytes of data          | uint32 masked CRC32C of the data
// where CRC32C is the Castagnoli CRC (reflected polynomial 0x82F63B78) and masking is
// ((crc >> 15) | (crc << 17)) + 0xa282ead8, so that a CRC of data holding CRCs stays strong.
//
// Each record's data is a tensorboard.Event (TensorBoard's event.proto): wall_time = 1
// (double), step = 2 (int64), and one of file_version = 3 (string: "brain.Event:2" in the
// file's first record) or summary = 5 (a tensorboard.Summary, summary.proto: repeated Value
// value = 1, each with tag = 1 (string) and simple_value = 2 (float)). TensorBoard's scalar
// dashboard shows such simple values under their tags. The field numbers are the published
// schema's; tests/python/tensorboard/ holds the .proto files the test reads the files with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/output_file.h"

namespace trident::io {

// The Castagnoli CRC-32 of `size` bytes, and its masked form as TFRecord stores it.
uint32_t crc32c(const void* data, std::size_t size);
uint32_t masked_crc32c(const void* data, std::size_t size);

// `payload` framed as one TFRecord record.
std::string tfrecord(std::string_view payload);

// An Event protocol buffer holding `scalars` (tag, value) as a Summary.
std::string scalar_event(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars);

class EventWriter {
public:
    // Creates `dir` (and its parents) and in it events.out.tfevents.SECONDS.HOST (a name
    // TensorBoard looks for; a resumed run starts a new file beside the old), with the
    // file-version event. Throws trident::Error naming the file.
    explicit EventWriter(const std::string& dir);

    // One Summary of `scalars` at `step`, in one write: a write that fails throws
    // trident::Error naming the file and the errno, with the file cut back to its last whole
    // record so that a reader never meets half of one.
    void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);

    const std::string& path() const { return file_->path(); }

private:
    std::unique_ptr<OutputFile> file_;
};

}  // namespace trident::io
