#pragma once

// The text forms of what a request asks for — output names and wire dtypes — as the clients'
// flags and the server's model info spell them.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "praxis/v1/praxis.pb.h"

namespace praxis::wire {

// "float32" | "bfloat16" | "float16" → the wire dtype of float tensors; InvalidArgument otherwise.
absl::StatusOr<v1::DType> ParseWireDtype(const std::string& name);

// The OutputSelection of `names` (velocity, cond, taps, tap.N, embeddings, positions);
// InvalidArgument naming an unknown output.
absl::StatusOr<v1::OutputSelection> ParseOutputs(const std::vector<std::string>& names);

}  // namespace praxis::wire
