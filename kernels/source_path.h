// The path of a source file as the repository names it ("kernels/cpu/cpu_ops.cpp"), for
// messages that cite the code: __FILE__ holds whatever path the build gave the compiler
// (absolute on the build machine, or ../ from the build directory), which means nothing to
// a user of the binary.
#pragma once

#include <string_view>

namespace trident {

// From the last path component that is one of the repository's top-level source
// directories (src, kernels, model, data) on; `file` unchanged if there is none.
constexpr const char* source_path(const char* file) {
    const std::string_view path(file);
    const char* found = file;
    for (std::size_t at = 0; at < path.size(); ++at) {
        if (at > 0 && path[at - 1] != '/') continue;
        for (const std::string_view top : {"src/", "kernels/", "model/", "data/"})
            if (path.substr(at, top.size()) == top) found = file + at;
    }
    return found;
}

}  // namespace trident
