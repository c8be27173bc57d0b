// The group of one process (see solo_comm.h).
#include "parallel/solo_comm.h"

#include <algorithm>

#include "error.h"

namespace trident::parallel {

void SoloComm::reduce_scatter(const float* in, float* out, std::size_t count) {
    if (in != out) std::copy_n(in, count, out);
}

void SoloComm::all_gather(const float* in, float* out, std::size_t count) {
    if (in != out) std::copy_n(in, count, out);
}

void SoloComm::send(const float*, std::size_t, int, int) {
    throw Error("internal: send in a group of one process");
}

void SoloComm::send_async(const float*, std::size_t, int, int) {
    throw Error("internal: send in a group of one process");
}

void SoloComm::recv(float*, std::size_t, int, int) {
    throw Error("internal: recv in a group of one process");
}

}  // namespace trident::parallel
