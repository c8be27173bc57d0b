// What a resume changes of the run it continues, said or refused before the first step
// (docs/RELIABILITY.md, "What is found before step 1").
#pragma once

#include "config/config.h"
#include "parallel/world.h"
#include "train/checkpoint.h"

namespace trident::commands {

// What the resume changes of the run it continues (train/resume_checks.h), against the
// config the checkpoint recorded: another seed or global batch stops it (or with
// checkpoint.allow_order_change is said), another training.steps and the later checkpoints
// that the first save will delete are said. Rank 0 judges for all. Collective.
void check_resume_changes(const config::Config& now, const train::CheckpointShare& ck,
                          parallel::World& world, bool leader);

}  // namespace trident::commands
