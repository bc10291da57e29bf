#pragma once

// The model's check of one step's inputs, run once per request by the server before queueing
// (server/step_request.cc) and by VideoBackbone::Forward for direct callers.

#include "absl/status/status.h"
#include "model/config.h"
#include "model/step.h"

namespace praxis::model {

// Checks every shape, dtype and value of `in` against `config` (with full isfinite passes);
// InvalidArgument naming the field and what was expected. Steps that pass may go to
// VideoBackbone::ForwardValidated (and stacked, StackSteps, to StepRunner::Run). Pure,
// thread-safe.
absl::Status ValidateStep(const BackboneConfig& config, const StepInputs& in);

}  // namespace praxis::model
