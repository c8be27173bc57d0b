// ZeRO-3's parameter shard in a file (optimizer.offload_params; ZeRO-Infinity's parameter
// offload, Rajbhandari et al., arXiv 2104.07857): this rank's parts of the parameters, in the
// training precision, live in <offload_dir>/param_shard.rank<R> instead of memory, laid out as
// the shard is (model/flat_buffer.h: each unit's part, in unit order; at ZeRO-3 also the
// order of the optimizer state, data_parallel.h's OwnedPart::state).
//
// Before a unit is all-gathered its part is read into a host buffer and uploaded to a staging
// buffer of the part's size (ZeroUnits, zero_units.h); the model announcing the unit that
// comes next (params_prefetch) starts its read on the I/O thread under the current unit's
// compute. The update writes each chunk of updated parameters back (optim/adamw_offload.cpp).
// A checkpoint's save, the replica check and a resume hold the whole shard in memory for as
// long as they read or write it (hold_shard / let_go_shard).
//
// A failed read in the forward or backward cannot stop this rank alone (its replicas wait in
// the unit's all-gather): the part is taken as zeros and the failure kept until check(),
// which the trainer calls where every rank agrees (train/trainer.h, agree_on_offload).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/offload_file.h"
#include "kernels/ops.h"
#include "model/flat_buffer.h"

namespace trident::data_parallel {

class ParamFile {
public:
    // The file for the shard of `params` (sharded), reserved; `dir` must have room for it and
    // `state_bytes` more (the rank's optimizer state file, made next).
    ParamFile(kernels::Ops& ops, model::FlatBuffer& params, const std::string& dir, int rank,
              std::uint64_t state_bytes);

    // Starts reading unit u's part (nothing if it is under way already).
    void fetch(std::size_t u);
    // Unit u's part (fetched now if it was not), in `to` (part_size(u) elements on the device).
    void fetched(std::size_t u, kernels::Ptr to);
    // The parts read ahead and not taken dropped (the update is about to change the file).
    void forget_reads();
    // Elements [first, first + count) of the shard, from or into host memory of the
    // parameters' type; returns once done. Throw io::OffloadError where it fails (or any
    // transfer before it did).
    void write(std::size_t first, std::size_t count, const void* from);
    void read(std::size_t first, std::size_t count, void* to);
    // Throws io::OffloadError for a transfer that failed since the last call, or the file gone.
    void check();

    // The whole shard into memory from the file, and back (written unless `unchanged`) and let
    // go. Throw io::OffloadError as check() does.
    void hold_shard();
    void let_go_shard(bool unchanged);

    std::uint64_t bytes_read() const { return file_.bytes_read(); }
    std::uint64_t bytes_written() const { return file_.bytes_written(); }
    const std::string& path() const { return file_.path(); }

private:
    struct Read {
        std::uint64_t seq;
        std::vector<char> host;  // the part, in the parameters' type
    };
    std::uint64_t at(std::size_t element) const { return element * element_bytes_; }

    kernels::Ops& ops_;
    model::FlatBuffer& params_;
    std::size_t element_bytes_;
    std::vector<std::size_t> part_offsets_;  // where each unit's part starts in the shard
    io::OffloadFile file_;
    std::map<std::size_t, Read> reads_;  // by unit: fetched, not yet taken
};

}  // namespace trident::data_parallel
