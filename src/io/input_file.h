// Opening the files Trident reads (configs, manifests, checkpoints, weights, datasets,
// tokenizer files): a path that names no regular file (a FIFO, a device such as /dev/zero, a
// socket, a directory) is refused at once with one message, where opening it would block
// until a writer came or reading it would never end. Whole-file reads have a size cap.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace trident::io {

// What a file of `mode` (st_mode) is, as messages say it: "a FIFO", "a character device", "a
// block device", "a socket", "a directory", or "a regular file".
const char* file_kind(mode_t mode);

// A read-only descriptor of `path` (close it), or a trident::Error naming the file: it cannot
// be opened, or it is not a regular file ("not a regular file (a FIFO)"). Never blocks on a
// FIFO: it is opened without waiting for a writer, then refused.
int open_regular(const std::string& path);

// The whole of the regular file `path`, at most `max_bytes` of it: a larger file is refused
// with one message naming `what` (e.g. "a config") and the limit.
std::string read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what);

}  // namespace trident::io
