#pragma once

// The `backbone` section of a checkpoint's config.json (docs/model.md), as typed structs.

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "wire/dtype_names.h"
#include "wire/step_inputs.h"

namespace praxis::model {

// The routed and shared experts of the MoE blocks.
struct MoeConfig {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t expert_dim = 0;
  int64_t shared_dim = 0;
};

// One tower's stack and projections. Block indices are 0-based positions in the stack.
struct TowerConfig {
  int64_t depth = 0;
  int64_t ffn_dim = 0;
  std::vector<int64_t> moe_blocks;
  std::vector<int64_t> tap_blocks;      // encoder only
  int64_t video_in_c_in = 0;            // video_in.c_in
  int64_t text_in_c_in = 0;             // encoder only: text_in.c_in
  std::vector<int64_t> unpatch_factor;  // decoder only: (t, ph, pw), t == 1
  int64_t video_out_c_out = 0;          // decoder only: video_out.c_out

  bool is_moe(int64_t block) const;
};

// The whole backbone; every (assumed) choice of SPEC is a field here, with the default of SPEC.
struct BackboneConfig {
  int64_t dim = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t timestep_dim = 0;
  int64_t num_registers = 0;
  int64_t text_dim = 0;
  std::string dtype = "float32";  // parameter dtype of the checkpoint
  MoeConfig moe;
  TowerConfig encoder;
  TowerConfig decoder;
  double rope_theta = 10000.0;
  bool qk_norm = true;
  double norm_eps = 1e-6;
  std::string gelu_approximate = "tanh";  // "tanh" | "none"
  double routed_scale = 1.0;
  int64_t text_position_offset = 1;
  int64_t decoder_frame_block_offset = 2;
  double clean_timestep = 0.0;
  std::string modulation_dtype = "float32";
  int64_t flex_block_size = 128;  // attention.flex_block_size

  int64_t head_dim() const { return dim / num_heads; }
  int64_t ph() const { return decoder.unpatch_factor[1]; }
  int64_t pw() const { return decoder.unpatch_factor[2]; }
  // C: latent channels as the encoder sees them (patched).
  int64_t latent_channels() const { return encoder.video_in_c_in; }
  // The feature sizes of a step's inputs (what ModelInfo tells clients).
  wire::StepDims step_dims() const { return {text_dim, latent_channels()}; }
  torch::ScalarType param_dtype() const;
};

// The largest config.json read; a real one is a few KiB.
inline constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

// Parses the JSON text of a config.json. InvalidArgument naming the key for a missing `backbone`
// section, an unknown or missing key, a wrong type, or inconsistent values (the reference's checks,
// in its order); then for a size beyond its upper bound ("backbone.dim: 1099511627776 exceeds the
// limit of 131072") or more than kMaxParameters in all (model/config_bounds.h). Every product is
// overflow-checked. Pure, thread-safe; the entry point of the config fuzzer.
absl::StatusOr<BackboneConfig> ParseConfig(const std::string& json_text);

// Reads and parses `path` (a config.json, or a directory holding one). Only a regular file of at
// most kMaxConfigBytes is read (a FIFO is refused, not waited on); errors are prefixed with it.
absl::StatusOr<BackboneConfig> LoadConfig(const std::string& path);

// The dtype names (wire/dtype_names.h), which config.json's dtype fields use.
using wire::DtypeName;
using wire::ParseDtype;

}  // namespace praxis::model
