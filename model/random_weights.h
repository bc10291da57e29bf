#pragma once

#include <cstdint>

#include "model/backbone.h"
#include "model/config.h"

namespace praxis::model {

// Deterministic random weights for `config` (every name, shape and dtype of ExpectedParameters):
// the server's embedded default model and the benchmarks, where no checkpoint is given. Matrices
// are N(0, 1/fan_in), norms and biases small, so every tensor matters. Same seed, same weights.
TensorMap RandomWeights(const BackboneConfig& config, uint64_t seed);

}  // namespace praxis::model
