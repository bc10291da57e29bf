#pragma once

// Steps and their outputs in safetensors files, as praxis-forward and praxis-cli read and write
// them: inputs under the SPEC §2 names, outputs under the names the server streams.

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "model/backbone.h"
#include "model/masks.h"

namespace praxis::model {

// text, anchor, optional clean, noised, timesteps from `path`; frames_per_chunk from the flag
// value `frames_per_chunk` or, when it is 0, from a one-element tensor of that name in the file.
// The tensors are not validated here (ValidateStep does that).
absl::StatusOr<StepInputs> ReadStepInputs(const std::string& path, int64_t frames_per_chunk);

// "a,b,c,d" → the four rope shifts; InvalidArgument naming --rope_shifts otherwise.
absl::StatusOr<std::array<int64_t, 4>> ParseRopeShifts(const std::string& text);

// "text_len,h,w,K,F" → a WindowLayout with the anchor grid h x w (registers unset);
// InvalidArgument naming `flag` otherwise.
absl::StatusOr<WindowLayout> ParseLayout(const std::string& text, const std::string& flag);

// Every output of a step under its streamed name: velocity (with decode), cond, tap.0 …,
// embeddings, positions.
std::vector<std::pair<std::string, torch::Tensor>> NamedOutputs(const BackboneOutput& out);

}  // namespace praxis::model
