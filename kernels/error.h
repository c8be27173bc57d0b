// The one exception type users see: a message that names the cause (file, line, key) and,
// where it helps, what to do. Thrown anywhere, caught once in main, printed as one line.
#pragma once

#include <stdexcept>
#include <string>

namespace trident {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace trident
