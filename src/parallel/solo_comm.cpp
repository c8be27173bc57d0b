// The group of one process (see solo_comm.h).
#include "parallel/solo_comm.h"

#include <cstring>

#include "kernels/error.h"

namespace trident::parallel {

void SoloComm::reduce_scatter(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    if (in.data != out.data) std::memmove(out.data, in.data, count * kernels::size_of(out.dtype));
}

void SoloComm::all_gather(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    if (in.data != out.data) std::memmove(out.data, in.data, count * kernels::size_of(out.dtype));
}

void SoloComm::all_to_all(kernels::ConstPtr in, kernels::Ptr out, std::size_t count) {
    if (in.data != out.data) std::memmove(out.data, in.data, count * kernels::size_of(out.dtype));
}

void SoloComm::all_to_all_v(kernels::ConstPtr in, const std::vector<std::size_t>& send,
                            kernels::Ptr out, const std::vector<std::size_t>&) {
    all_to_all(in, out, send.at(0));
}

void SoloComm::send(kernels::ConstPtr, std::size_t, int, int) {
    throw Error("internal: send in a group of one process");
}

Request SoloComm::isend(kernels::ConstPtr, std::size_t, int, int) {
    throw Error("internal: send in a group of one process");
}

void SoloComm::recv(kernels::Ptr, std::size_t, int, int) {
    throw Error("internal: recv in a group of one process");
}

}  // namespace trident::parallel
