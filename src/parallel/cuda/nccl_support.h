// What NcclComm and NcclMessages share: NCCL's error check, the NCCL type of each element type,
// and a group guard.
#pragma once

#include <nccl.h>

#include "kernels/dtype.h"

namespace trident::parallel {

// Throws trident::Error naming NCCL's message, the call, and the file and line.
void check_nccl(ncclResult_t status, const char* call, const char* file, int line);
#define TRIDENT_NCCL_CHECK(call) ::trident::parallel::check_nccl((call), #call, __FILE__, __LINE__)

// The type NCCL moves `t` as. NCCL has no 16-bit integers: they move (never reduce) as fp16
// words, as bool and fp8 move as bytes.
ncclDataType_t nccl_type(kernels::DType t);
// The type NCCL reduces `t` as; throws for the types it only moves under another's name.
ncclDataType_t nccl_reduction_type(kernels::DType t);

// ncclGroupStart, and its ncclGroupEnd however the scope is left: a call that throws inside the
// group still closes it, so the thread is not left in an open group (where every later NCCL
// call would be deferred to a group end that never comes).
class NcclGroup {
public:
    NcclGroup();
    ~NcclGroup();
    NcclGroup(const NcclGroup&) = delete;
    NcclGroup& operator=(const NcclGroup&) = delete;
    // Ends the group, where NCCL launches its calls; throws if that fails.
    void end();

private:
    bool open_ = true;
};

}  // namespace trident::parallel
