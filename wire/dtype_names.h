#pragma once

// The names of the float dtypes a model, a flag or a request may use: "float32", "bfloat16",
// "float16". One table for the config's dtype, --dtype, the wire dtype flags and ModelInfo.dtype.

#include <torch/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace praxis::wire {

// "float32" | "bfloat16" | "float16" to the torch dtype; InvalidArgument otherwise.
absl::StatusOr<torch::ScalarType> ParseDtype(const std::string& name);

// The inverse of ParseDtype ("float32", ...); torch's own name for other dtypes.
std::string DtypeName(torch::ScalarType dtype);

}  // namespace praxis::wire
