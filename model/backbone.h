#pragma once

// VideoBackbone: encoder tower + decoder tower of one flow-matching denoising step
// (seed backbone-api-0.5.0, SPEC §2–§5, docs/model.md).

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/mask_cache.h"
#include "model/step.h"

namespace praxis::model {

struct BackboneWeights;  // model/towers.h
using TensorMap = std::unordered_map<std::string, torch::Tensor>;

// How a backbone runs: its device, attention path and mask-cache size.
struct BackboneOptions {
  torch::Device device = torch::kCPU;
  AttentionMode attention = AttentionMode::kSparse;
  int64_t mask_cache_entries = 64;
  int64_t mask_cache_bytes = int64_t{256} << 20;
};

// Checks every shape, dtype and value of `in` against `config`; InvalidArgument naming the field
// and what was expected. Forward calls it; the server calls it before queueing.
absl::Status ValidateStep(const BackboneConfig& config, const StepInputs& in);

// The model the server holds. Weights are plain tensors on the device; masks and attention plans
// come from the owned MaskCache, so a forward over a layout seen before builds nothing.
// Thread-safe: concurrent Forward calls are safe (weights are read-only, the cache is
// thread-safe), though the server runs one batch at a time per device.
class VideoBackbone {
 public:
  // Takes the validated tensors of a checkpoint (names per docs/model.md) already in their final
  // dtype; moves them to options.device.
  static absl::StatusOr<std::unique_ptr<VideoBackbone>> Create(const BackboneConfig& config,
                                                               const TensorMap& weights,
                                                               const BackboneOptions& options);
  ~VideoBackbone();

  // One denoising step. InvalidArgument for inputs that fail ValidateStep; Internal for a LibTorch
  // failure. No gradients are recorded.
  absl::StatusOr<BackboneOutput> Forward(const StepInputs& inputs);

  const BackboneConfig& config() const { return config_; }
  const BackboneOptions& options() const { return options_; }
  MaskCache& mask_cache() { return mask_cache_; }
  const MaskCache& mask_cache() const { return mask_cache_; }
  // The dtype of the parameters (and of the float outputs).
  torch::ScalarType dtype() const;

 private:
  VideoBackbone(BackboneConfig config, BackboneOptions options, std::unique_ptr<BackboneWeights> w);
  absl::StatusOr<BackboneOutput> ForwardValid(const StepInputs& in);
  // The cached mask (and attention plan or dense mask) of a tower layout.
  absl::StatusOr<std::shared_ptr<const TowerMask>> Mask(const MaskKey& key);

  const BackboneConfig config_;
  const BackboneOptions options_;
  std::unique_ptr<BackboneWeights> w_;
  MaskCache mask_cache_;
};

}  // namespace praxis::model
