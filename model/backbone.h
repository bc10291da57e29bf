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
#include "common/shared_lru_cache.h"
#include "model/attention.h"
#include "model/config.h"
#include "model/cpu_kernels.h"
#include "model/layers.h"
#include "model/mask_cache.h"
#include "model/step.h"
#include "model/step_validation.h"  // ValidateStep, Forward's check
#include "model/text_cache.h"

namespace praxis::model {

struct BackboneWeights;  // model/towers.h
using TensorMap = std::unordered_map<std::string, torch::Tensor>;

// How a backbone runs: its device, attention path and mask-cache size (which also bounds the
// cache of layout plans).
struct BackboneOptions {
  torch::Device device = torch::kCPU;
  AttentionMode attention = AttentionMode::kSparse;
  int64_t mask_cache_entries = 64;
  int64_t mask_cache_bytes = int64_t{256} << 20;
  // Whether a 16-bit model on the CPU is computed in float32 (VideoBackbone::compute_dtype); by
  // default where ReducedGemmInFloat32 says its dtype's GEMM is emulated or the slower one.
  std::optional<bool> cpu_float32_compute = std::nullopt;
  // On the CPU, the texts whose projected tokens stay cached (model/text_cache.h) and the bytes
  // they may hold; 0 entries projects every row's text every step. Ignored on CUDA, where the
  // step runs as one captured graph.
  int64_t text_cache_entries = 0;
  int64_t text_cache_bytes = int64_t{128} << 20;
};

// What a step needs besides its tensors, a function of its layout key alone and decided on the
// host before any device work — so that the device run reads nothing back and can be captured in
// a CUDA graph: the towers' cached masks and attention plans, their rotary tables (on the model's
// device) and the encoder positions (on the host). Read-only once built.
struct LayoutPlan {
  WindowLayout layout;
  std::shared_ptr<const TowerMask> enc_mask;
  std::shared_ptr<const TowerMask> dec_mask;  // null when the step does not decode
  RopeTables enc_rope;
  RopeTables dec_rope;      // undefined tensors when the step does not decode
  torch::Tensor positions;  // int64 [T_enc], host

  int64_t nbytes() const;  // the rotary tables and positions (the masks are charged to MaskCache)
};

// The model the server holds. Weights are plain tensors on the device; masks and attention plans
// come from the owned MaskCache, so a forward over a layout seen before builds nothing.
// Thread-safe: Forward and ForwardValidated may run on any number of threads at once (the weights
// are read-only after Create and the MaskCache is thread-safe); the server runs one batch at a
// time per device, or on a CPU up to --concurrent_batches side by side.
class VideoBackbone {
 public:
  // Takes the validated tensors of a checkpoint (names per docs/model.md) already in their final
  // dtype; moves them to options.device.
  static absl::StatusOr<std::unique_ptr<VideoBackbone>> Create(const BackboneConfig& config,
                                                               const TensorMap& weights,
                                                               const BackboneOptions& options);
  ~VideoBackbone();

  // One denoising step of unchecked inputs (tools, tests): ValidateStep, then ForwardValidated.
  // InvalidArgument for inputs that fail ValidateStep; Internal for a LibTorch failure.
  absl::StatusOr<BackboneOutput> Forward(const StepInputs& inputs);

  // One denoising step of inputs that have passed ValidateStep(config(), ·) — each step of a
  // stacked batch, as the server checks every request before queueing (StackSteps keeps that
  // true). Not checked again: inputs that fail ValidateStep are a caller bug, with undefined
  // results. Inputs are moved to the device once, here (through pinned memory on CUDA). Internal
  // for a LibTorch failure. No gradients are recorded.
  absl::StatusOr<BackboneOutput> ForwardValidated(const StepInputs& inputs);

  // ForwardValidated in its three parts, for runners that stage, capture or replay them apart
  // (model/step_graphs.h). Each is thread-safe like ForwardValidated.
  // `inputs` with every tensor on options().device (through pinned memory from the host on CUDA);
  // Internal if a copy fails.
  absl::StatusOr<StepInputs> OnDevice(const StepInputs& inputs) const;
  // The plan of a validated step's layout (only shapes, decode and rope shifts are read), cached
  // by layout key (wire::LayoutKey): built once per layout (masks found or built, rotary tables
  // computed — per step they took a fifth of a small layout's CPU step), then shared. Internal
  // for a LibTorch failure, or a mask build's error (neither cached).
  absl::StatusOr<std::shared_ptr<const LayoutPlan>> PlanLayout(const StepInputs& inputs);
  // OnDevice, then RunPlanned on `plan` (the plan of `inputs`' layout), errors as statuses: what
  // ForwardValidated runs after planning, and what a runner that already holds the plan runs.
  absl::StatusOr<BackboneOutput> ForwardPlanned(const StepInputs& inputs,
                                                const LayoutPlan& plan) const;
  // Both towers over `in` (validated, on the device, of `plan`'s layout): device work only, so on
  // CUDA it queues kernels and returns without waiting for them. Positions come from the plan, on
  // the host; on the CPU, each row's text tokens from the text cache where there is one. Throws
  // on a LibTorch failure; the caller turns that into a status.
  BackboneOutput RunPlanned(const StepInputs& in, const LayoutPlan& plan) const;

  const BackboneConfig& config() const { return config_; }
  const BackboneOptions& options() const { return options_; }
  MaskCache& mask_cache() { return mask_cache_; }
  const MaskCache& mask_cache() const { return mask_cache_; }
  // Hits, misses and size of the layout-plan cache.
  CacheStats plan_cache_stats() const { return plans_.stats(); }
  // Hits, misses and size of the text cache; all zero where there is none.
  CacheStats text_cache_stats() const { return texts_ ? texts_->stats() : CacheStats{}; }
  // The dtype of the parameters as loaded (the config's).
  torch::ScalarType dtype() const;
  // The dtype the model computes in and returns its float outputs in: dtype(), or float32 for a
  // 16-bit model on a CPU whose 16-bit GEMM is emulated or the slower one (ReducedGemmInFloat32),
  // where its weights are converted at Create within cpu::SetFloat32WeightBudget's bytes.
  torch::ScalarType compute_dtype() const;

 private:
  VideoBackbone(BackboneConfig config, BackboneOptions options, std::unique_ptr<BackboneWeights> w,
                std::optional<cpu::Float32WeightHold> float32_hold);
  // PlanLayout's builder: masks from the mask cache, tables computed.
  absl::StatusOr<LayoutPlan> BuildPlan(const StepInputs& inputs);
  // The cached mask (and attention plan or dense mask) of a tower layout.
  absl::StatusOr<std::shared_ptr<const TowerMask>> Mask(const MaskKey& key);

  const BackboneConfig config_;
  const BackboneOptions options_;
  // w_'s float32 bytes, when converted; declared first so that it is given back after w_ is freed.
  std::optional<cpu::Float32WeightHold> float32_hold_;
  std::unique_ptr<BackboneWeights> w_;
  MaskCache mask_cache_;
  SharedLruCache<std::string, LayoutPlan> plans_;  // by wire::LayoutKey
  std::unique_ptr<TextCache> texts_;               // null: none (CUDA, or 0 entries)
};

}  // namespace praxis::model
