#pragma once

// The model's check of one step's inputs, run once per request by the server before queueing
// (server/step_request.cc) and by VideoBackbone::Forward for direct callers.

#include <array>
#include <iterator>

#include "absl/status/status.h"
#include "model/config.h"
#include "model/step.h"
#include "wire/step_inputs.h"

namespace praxis::model {

// The largest |value| of each of a step's inputs, as ValidateStep's finite-value pass read it
// (+inf if a value is infinite, else NaN if one is NaN; 0 for an absent or empty input, and for
// the timesteps, which are checked against [0, 1] instead): what a caller's own bound on the
// values (the server's --max_abs_input) needs, without a second pass.
struct InputMagnitudes {
  std::array<double, std::size(wire::kInputFields)> max_abs{};  // in wire::kInputFields' order
};

// Checks every shape, dtype and value of `in` against `config` (with full isfinite passes);
// InvalidArgument naming the field and what was expected. When it passes and `magnitudes` is
// given, fills it. Steps that pass may go to VideoBackbone::ForwardValidated (and stacked,
// StackSteps, to StepRunner::Run). Pure, thread-safe.
absl::Status ValidateStep(const BackboneConfig& config, const StepInputs& in,
                          InputMagnitudes* magnitudes = nullptr);

}  // namespace praxis::model
