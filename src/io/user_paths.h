// The paths a user hands Trident (options such as --output, config keys such as data.train,
// logging.trace or checkpoint.dir), checked before any work is done on them
// (docs/RELIABILITY.md, "What is found before step 1"):
//
// - A path no system call could take (empty, a NUL inside, longer than PATH_MAX, a name in it
//   longer than NAME_MAX) is refused with the key named and the value shown cut to its start,
//   where the call would fail with a raw `filesystem error` line echoing all of it.
// - An output whose existing target is not a regular file (a device such as /dev/null, a
//   FIFO, a socket, a directory) is refused rather than written: the writers rename a
//   finished temporary file over their target, which as root would turn /dev/null into a
//   regular file for the whole machine, and a FIFO would block the run.
// - An output's directory is made and probed writable at start-up (output_file.h), so a
//   read-only place is found before the run rather than after its last step.
#pragma once

#include <string>
#include <string_view>

namespace trident::io {

// `text` as a message shows it: whole up to 200 characters, else its first 200 and its
// length, so that a pasted file given as a path makes a message of one screen line.
std::string shown(std::string_view text);

// What keeps `path` from being a path at all ("empty", "a path of 5000 characters, more than
// the 4095 a path may have", ...), or "" when it can be one.
std::string path_problem(std::string_view path);

// Throws trident::Error "WHAT: PROBLEM" when path_problem(path) finds one.
void check_path_text(const std::string& path, const std::string& what);

// What `path` names when it exists and is not a regular file ("a character device", "a
// FIFO", "a directory", ...), following symbolic links; "" when it is one or is missing.
std::string special_kind(const std::string& path);

// Throws "WHAT: 'PATH' exists and is KIND, not a regular file: ..." when special_kind finds
// one (no "WHAT: " without `what`): what every writer of a file asks before it creates or
// replaces it.
void refuse_special_file(const std::string& path, const std::string& what = "");

// An input path checked: its text, and its status readable (a loop of symbolic links, a
// component that is not a directory but for a missing file, which the reader reports).
// Throws "WHAT: 'PATH': cannot read its status: ..." naming the option or key.
void check_input_path(const std::string& path, const std::string& what);

// An output file checked before any work: its text, its existing target (a regular file or
// none), and its directory made and probed writable. Throws "WHAT: ..." naming the option or
// key.
void check_output_file(const std::string& path, const std::string& what);

// An output directory (logging.tensorboard, export --format hf's folder) checked alike: its
// text, then made if missing and probed writable; an existing non-directory is refused.
void check_output_directory(const std::string& dir, const std::string& what);

}  // namespace trident::io
