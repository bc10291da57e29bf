#pragma once

// Random step inputs: noise for warm-up, benchmarks, load tests and synthetic CLI steps, made the
// same way by the server (which knows its config) and the clients (which read the dims from
// GetModelInfo).

#include <torch/types.h>

#include <cstdint>

#include "wire/step_inputs.h"

namespace praxis::wire {

// Random inputs of `rows` rows with geometry `g`, deterministic in `seed`; float inputs in
// `dtype`, timesteps float32 uniform in [0, 1]. Thread-safe (its generator is its own).
StepInputs SyntheticInputs(const StepDims& dims, const StepGeometry& g, int64_t rows, uint64_t seed,
                           torch::ScalarType dtype = torch::kFloat32);

}  // namespace praxis::wire
