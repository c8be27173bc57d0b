// A scratch directory for one test, unique to the process and removed afterwards.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

struct TempDir {
    std::filesystem::path dir;

    explicit TempDir(const std::string& name)
        : dir(std::filesystem::temp_directory_path() /
              ("trident_" + name + "_" + std::to_string(::getpid()))) {
        std::filesystem::create_directories(dir);
    }
    ~TempDir() { std::filesystem::remove_all(dir); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    std::string operator/(const std::string& name) const { return (dir / name).string(); }
};
