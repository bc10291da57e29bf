#pragma once

// Many callers' steps as one batch: the layout key that says which steps may share a batch (and so
// one cached mask), stacking their rows, and splitting a batch's outputs back per caller.

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "model/backbone.h"
#include "model/masks.h"

namespace praxis::model {

// The geometry of a step (registers left 0: they are the config's): what its masks, tokens and
// cost depend on. `in` must have passed ValidateStep.
WindowLayout StepLayout(const StepInputs& in);

// Steps with equal keys have the same sequence layout (text length, anchor and video grid, K, F,
// decode, rope shifts), so their rows stack into one batch that shares both towers' masks and
// rotary tables. Human-readable: it is returned to clients and used in logs.
std::string LayoutKey(const StepInputs& in);

// The same key from the geometry alone (registers ignored): the clients compute it from a
// request's shapes and send it as the x-praxis-layout header, for layout-affinity routing.
std::string LayoutKey(const WindowLayout& layout, bool decode,
                      const std::array<int64_t, 4>& rope_shifts);

// Random inputs of `batch` rows for `layout` (registers ignored), deterministic in `seed`: noise
// for warm-up, benchmarks, load tests and synthetic CLI steps. Timesteps are uniform in [0, 1].
StepInputs SyntheticStep(const BackboneConfig& config, const WindowLayout& layout, int64_t batch,
                         uint64_t seed, torch::ScalarType dtype = torch::kFloat32);

// Concatenates the rows of `steps` (all of one LayoutKey, at least one) along the batch dimension.
StepInputs StackSteps(absl::Span<const StepInputs* const> steps);

// Rows [start, start + rows) of every batch-first output of `out`, spans and counts kept.
BackboneOutput SliceRows(const BackboneOutput& out, int64_t start, int64_t rows);

}  // namespace praxis::model
