#pragma once

// Steps in safetensors files, as praxis-forward and praxis-cli read them: the inputs under their
// SPEC §2 names (wire/step_inputs.h), optionally with a one-element frames_per_chunk tensor.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "wire/step_inputs.h"

namespace praxis::wire {

// The inputs in `path`; frames_per_chunk from `frames_per_chunk` when it is not 0, else from a
// one-element tensor of that name in the file. Shapes and values are not validated here
// (the model's ValidateStep does that), so a missing tensor is left undefined.
absl::StatusOr<StepInputs> ReadStepInputs(const std::string& path, int64_t frames_per_chunk);

}  // namespace praxis::wire
