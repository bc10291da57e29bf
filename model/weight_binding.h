#pragma once

// Binds a checkpoint's tensors to the towers' weight structs by the names of the parameter table
// (model/param_names.h). Internal to model/: VideoBackbone::Create is the public face.

#include <torch/types.h>

#include <memory>

#include "absl/status/statusor.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/towers.h"

namespace praxis::model {

// The weights of `config` looked up in `weights` by ListParameters' names, moved to `device`, with
// the norms prepared (NormWeight) and q, k, v and the gate stacked into one matrix. InvalidArgument
// naming the first missing weight; LibTorch failures throw (the caller catches them).
absl::StatusOr<std::unique_ptr<BackboneWeights>> BindWeights(const BackboneConfig& config,
                                                             const TensorMap& weights,
                                                             torch::Device device);

}  // namespace praxis::model
