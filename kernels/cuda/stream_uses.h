// Device memory that work on a stream of its own still uses: the process's record of it, so
// that the caching allocator (device_allocator.h), which hands a block out again as soon as
// the compute stream has queued its last use, does not give it to new compute while another
// stream's collective still reads or writes it.
//
// NcclComm's non-blocking collectives and NcclMessages' sends run on communication streams
// and are ordered against the compute stream only when their request is waited for; a buffer
// released before that (a caller's slip, or a scratch buffer given back early) would be
// reused mid-collective. They record their buffers here with the event that marks the
// collective's end; DeviceAllocator::release makes the compute stream wait for the events of
// the uses a released block overlaps (at once, on the host, no waiting), so everything queued
// on the block afterwards runs after them. The bookkeeping is pending_uses.h's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>

namespace trident::kernels::cuda {

// An event shared by its recorder and this record, destroyed by the last of them.
using SharedEvent = std::shared_ptr<CUevent_st>;

// A new event recorded on `stream` after everything queued on it so far, with each of
// `ranges` ([data, data + bytes)) recorded as in use until it has happened.
SharedEvent record_stream_use(cudaStream_t stream,
                              std::initializer_list<std::pair<const void*, std::size_t>> ranges);

// Before [data, data + bytes) is used again: the compute stream (device.h) waits for every
// recorded use of it that may not have happened yet.
void await_stream_uses(const void* data, std::size_t bytes);

// How many uses the record holds now (those whose events have happened may still count).
std::size_t pending_stream_uses();

}  // namespace trident::kernels::cuda
