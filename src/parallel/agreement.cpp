// Agreeing on a failure over a group (see agreement.h).
#include "parallel/agreement.h"

#include <cstdint>
#include <vector>

namespace trident::parallel {

std::string first_failure(Comm& group, const std::string& error) {
    // The lowest failing rank r as the largest of size - r (0: none failed).
    int32_t turn = error.empty() ? 0 : group.size() - group.rank();
    group.all_reduce(&turn, 1, ReduceOp::max);
    if (turn == 0) return "";
    const int root = group.size() - turn;
    int64_t length = static_cast<int64_t>(error.size());
    group.broadcast(&length, 1, root);
    std::vector<uint8_t> text(error.begin(), error.end());
    text.resize(static_cast<std::size_t>(length));
    group.broadcast(text.data(), text.size(), root);
    return std::string(text.begin(), text.end());
}

}  // namespace trident::parallel
