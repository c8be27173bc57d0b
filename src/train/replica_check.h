// Silent data corruption found (training.check_replicas): ranks that must hold the same
// numbers compare a hash of each tensor, and the first copy that differs is named with its
// rank and tensor (docs/ARCHITECTURE.md, "Replica check"). A bit flipped in memory, a faulty
// GPU or a bug that lets replicas drift apart otherwise goes unnoticed: training carries on,
// each replica with its own weights, and the checkpoint holds one replica's.
//
// What is compared:
// - across the data-parallel replicas (the data-context group, the D·C ranks holding the same
//   weights): every parameter (ZeRO-0 to 2, where each holds them whole; ZeRO-3 shards them)
//   and, under ZeRO-0, the optimizer's state (fp32 master weights, Adam's moments), which
//   every replica then holds whole; under low-rank adapters, the frozen weights and the
//   adapters; a split expert's (model/param_layout.h) across the expert-data group alone, the
//   D·C/E ranks holding it;
// - across the tensor group: the tensors every tensor rank holds whole (LayerNorms,
//   row-parallel biases, wpe); across each key/value head's replicas (M > KVH), its rows of
//   k_proj and v_proj.
// Each rank hashes its copies (64-bit FNV-1a of each tensor's values) and all-gathers the
// hashes over the group (8 bytes per tensor per rank). The copy named is the first, in tensor
// order, that differs from what most of its group hold (with two members, from the first
// member's); the message of the lowest rank that found one is every rank's.
#pragma once

#include <string>

#include "parallel/comm.h"
#include "parallel/grid.h"
#include "train/trainer.h"

namespace trident::train {

// "" when every copy agrees; else, on every rank alike, which rank's copy of which tensor
// differs at step `step`. Collective over `world`, the whole grid. Plants the test fault
// TRIDENT_TEST_CORRUPT_REPLICA first.
std::string check_replicas(const config::Config& cfg, Trainer& trainer, parallel::Grid& grid,
                           parallel::Comm& world, int step);

}  // namespace trident::train
