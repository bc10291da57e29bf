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

// One caller's share of a batch's outputs: rows [start, start + rows) of the outputs `task` asks
// for, the others undefined. An output that every caller of the batch asks for (`every`) is a
// view of the batch's tensor, which then lives until the last of them has sent it: its bytes are
// the batch's rows, all of which callers reserved (server/byte_budget.h). Any other output is a
// copy of the task's rows, so that an answer never holds rows no caller reserved.
model::BackboneOutput TaskRows(const model::BackboneOutput& out, int64_t start, int64_t rows,
                               const model::OutputSelection& task,
                               const model::OutputSelection& every);

}  // namespace praxis::serve
