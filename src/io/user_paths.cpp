// Checks of the paths users give (see user_paths.h).
#include "io/user_paths.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <filesystem>

#include "io/input_file.h"
#include "io/output_file.h"
#include "kernels/error.h"

namespace trident::io {

namespace {

constexpr std::size_t kShownCharacters = 200;

// The longest name of one directory entry (NAME_MAX of Linux's file systems).
constexpr std::size_t kLongestName = NAME_MAX;

// "'PATH'" as messages quote a path, cut as shown() cuts it.
std::string in_quotes(std::string_view path) {
    std::string text = "'";
    text += shown(path);
    return text += "'";
}

}  // namespace

std::string shown(std::string_view text) {
    if (text.size() <= kShownCharacters) return std::string(text);
    return std::string(text.substr(0, kShownCharacters)) + "... (" + std::to_string(text.size()) +
           " characters)";
}

std::string path_problem(std::string_view path) {
    if (path.empty()) return "an empty path";
    if (path.find('\0') != std::string_view::npos)
        return in_quotes(path) + " holds a NUL character, which no path may";
    // PATH_MAX counts the terminating NUL.
    if (path.size() >= PATH_MAX)
        return "a path of " + std::to_string(path.size()) + " characters, more than the " +
               std::to_string(PATH_MAX - 1) + " a path may have: " + in_quotes(path);
    std::size_t begin = 0;
    while (begin < path.size()) {
        std::size_t end = path.find('/', begin);
        if (end == std::string_view::npos) end = path.size();
        if (end - begin > kLongestName)
            return in_quotes(path) + " holds a name of " + std::to_string(end - begin) +
                   " characters, more than the " + std::to_string(kLongestName) +
                   " a file name may have";
        begin = end + 1;
    }
    return "";
}

void check_path_text(const std::string& path, const std::string& what) {
    if (const std::string problem = path_problem(path); !problem.empty())
        throw Error(what + ": " + problem);
}

std::string special_kind(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
    return file_kind(st.st_mode);
}

void refuse_special_file(const std::string& path, const std::string& what) {
    if (const std::string kind = special_kind(path); !kind.empty())
        throw Error((what.empty() ? "" : what + ": ") + in_quotes(path) + " exists and is " + kind +
                    ", not a regular file: it is not written over; name a file");
}

void check_input_path(const std::string& path, const std::string& what) {
    check_path_text(path, what);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 && errno != ENOENT && errno != ENOTDIR)
        throw Error(what + ": " + in_quotes(path) +
                    ": cannot read its status: " + errno_text(errno));
}

void check_output_file(const std::string& path, const std::string& what) {
    check_path_text(path, what);
    refuse_special_file(path, what);
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    probe_writable_directory(parent.empty() ? "." : parent.string(), what);
}

void check_output_directory(const std::string& dir, const std::string& what) {
    check_path_text(dir, what);
    probe_writable_directory(dir, what);
}

}  // namespace trident::io
