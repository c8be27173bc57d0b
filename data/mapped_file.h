// A whole file mapped read-only into memory, unmapped when the owner goes: how the dataset
// readers see their files without reading them in (the page cache does the I/O).
//
// A mapped file truncated or rewritten in place while a run reads it makes the next read of
// a page past its new end a SIGBUS. The mappings are registered with a SIGBUS handler that,
// for a fault inside one, prints one line naming the file and ends the process with exit
// code 1 (under mpirun, which then ends the job), instead of a raw crash. A fault anywhere
// else is left to the default action.
#pragma once

#include <cstddef>
#include <string>

namespace trident::data {

class MappedFile {
public:
    MappedFile() = default;
    // Maps `path`; `what` names the config key in messages. An empty file has no mapping
    // (mmap refuses length 0): data() is then null.
    MappedFile(const std::string& path, const std::string& what);
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const unsigned char* data() const { return static_cast<const unsigned char*>(base_); }
    std::size_t bytes() const { return bytes_; }

private:
    void* base_ = nullptr;
    std::size_t bytes_ = 0;
    int slot_ = -1;  // in the SIGBUS handler's table of mappings; -1: none
};

}  // namespace trident::data
