#pragma once

// Many callers' steps as one batch: stacking the rows of steps of one layout key, and splitting a
// batch's outputs back per caller.

#include <cstdint>

#include "absl/types/span.h"
#include "model/step.h"

namespace praxis::serve {

// Concatenates the rows of `steps` (all of one LayoutKey, at least one) along the batch dimension.
model::StepInputs StackSteps(absl::Span<const model::StepInputs* const> steps);

// Rows [start, start + rows) of every batch-first output of `out`, spans and counts kept: views
// of `out`'s tensors.
model::BackboneOutput SliceRows(const model::BackboneOutput& out, int64_t start, int64_t rows);

}  // namespace praxis::serve
