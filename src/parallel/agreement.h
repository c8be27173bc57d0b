// Agreeing on a failure over a group: every rank learns whether any rank failed and why, so
// all of them take the same path afterwards (fall back, stop, retry) with the same message.
#pragma once

#include <string>

#include "parallel/comm.h"

namespace trident::parallel {

// "" when `error` is empty on every rank of `group`; else, on every rank, the message of the
// lowest rank whose error is not empty, as that rank wrote it. Collective over the group.
std::string first_failure(Comm& group, const std::string& error);

}  // namespace trident::parallel
