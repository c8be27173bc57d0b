// The files Trident writes (checkpoint shards, manifests and configs, the metrics file, traces,
// exported weights, token shards): every failure is a trident::Error naming the file, what
// failed and the errno ("runs/x/metrics.jsonl: cannot write: No space left on device
// (ENOSPC)"), so a full disk or a failing mount is told apart from a bug. Every write goes
// through here, which is also where the test-only write fault strikes (fault_injection.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace trident::io {

// "No space left on device (ENOSPC)": errno's text and its name.
std::string errno_text(int error);

// Only a regular file is written: a path naming a device, a FIFO, a socket or a directory is
// refused with a trident::Error (io/user_paths.h), never fed or waited on.
class OutputFile {
public:
    enum class Mode { create, append };  // create truncates what was there

    // `name`: what messages call the file (default `path`), e.g. the file a temporary one
    // will become.
    OutputFile(std::string path, Mode mode = Mode::create, std::string name = "");
    ~OutputFile();  // closes; a failure then goes unreported: call close() to see it
    OutputFile(const OutputFile&) = delete;
    OutputFile& operator=(const OutputFile&) = delete;

    // All of `size` bytes, or a trident::Error (some of them may have reached the file).
    void write(const void* data, std::size_t size);
    void write(std::string_view text) { write(text.data(), text.size()); }
    // `size` bytes over those at `offset`, which the file already holds (a header filled in
    // once what it counts is written); the end of the file stays where it is.
    void write_at(uint64_t offset, const void* data, std::size_t size);
    void sync();   // to the disk (fsync)
    void close();  // reports what closing finds (deferred write errors of some filesystems)

    // Bytes in the file: what it held when opened for append, plus every byte written since.
    uint64_t size() const { return size_; }
    // Cuts the file back to `bytes`: after a failed write, so that a reader never sees part
    // of a record.
    void truncate(uint64_t bytes);
    // `record` in one write, or (a write that fails) the file cut back to where it ended and
    // the write's error thrown: a file of records (lines, TFRecord) then only ever holds
    // whole ones, and a later record can still follow.
    void write_record(std::string_view record);
    const std::string& path() const { return path_; }

private:
    std::string path_, name_;
    int fd_ = -1;
    uint64_t size_ = 0;
};

// A file written under a temporary name beside `path` and renamed over it by commit(): a
// reader of `path` (a training run mapping a dataset) never sees it half written, keeps
// the old file's contents while this one is written, and a failed or abandoned write leaves
// `path` as it was (the temporary file is removed). Messages name `path`. A `path` that is
// not a regular file (a device, a FIFO; io/user_paths.h) is refused, never renamed over.
class ReplacingFile {
public:
    explicit ReplacingFile(const std::string& path);
    ~ReplacingFile();  // removes the temporary file unless commit() ran
    ReplacingFile(const ReplacingFile&) = delete;
    ReplacingFile& operator=(const ReplacingFile&) = delete;

    void write(const void* data, std::size_t size) { file_.write(data, size); }
    void write_at(uint64_t offset, const void* data, std::size_t size) {
        file_.write_at(offset, data, size);
    }
    uint64_t size() const { return file_.size(); }  // bytes written so far
    // Synced and closed, not yet in place: commit() then only renames it, so that several
    // files written in turn appear together.
    void close();
    void commit();  // synced, closed (unless it was) and renamed into place

private:
    // The temporary name beside `path` (its directory made): refused first when `path` names
    // a device, a FIFO, a socket or a directory, which the rename would replace.
    static std::string temporary_beside(const std::string& path);

    std::string path_, temporary_;
    OutputFile file_;
    bool closed_ = false, committed_ = false;
};

// Writes `bytes` to `path` whole or not at all: into a temporary file beside it, synced, then
// renamed over `path`. Its parent directory is created if missing.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Makes directory `dir` (and its parents) if missing and writes, syncs and removes a small
// file in it, so that a directory a run cannot write (a file's path, under /proc, no
// permission, a read-only or full file system) is found before the run rather than at its
// first save. Throws trident::Error "WHAT: 'DIR' ...: cannot create: Permission denied (EACCES)".
void probe_writable_directory(const std::string& dir, const std::string& what);

// Flushes a file or directory that is already written to the disk (a directory: the names
// created or renamed in it).
void sync_path(const std::string& path);

}  // namespace trident::io
