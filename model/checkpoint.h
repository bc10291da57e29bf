#pragma once

// A checkpoint directory: config.json plus model.safetensors, or model.safetensors.index.json and
// its shards. The parameter names, shapes and dtypes are those of docs/model.md.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"
#include "wire/safetensors.h"

namespace praxis::model {

// Every checkpoint name starts with this.
inline constexpr char kBackbonePrefix[] = "backbone.";

// What one checkpoint tensor must be.
struct ParamSpec {
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;
};

// Checkpoint name to spec, in the order of the reference module's state_dict (tower by tower,
// module by module), which is also the order in which LoadCheckpoint reports the first mismatch.
using ParamSpecs = std::vector<std::pair<std::string, ParamSpec>>;

// Exactly the tensors of the parameter table (model/param_names.h, docs/model.md) for `config`:
// ListParameters with dtype config.param_dtype() except the always-float32 rows
// (t_embedding.freqs/phases, expert_bias). `config` must be valid.
ParamSpecs ExpectedParameters(const BackboneConfig& config);

// Whether checkpoint tensor `name` ends with one of the parameter table's always-float32 rows.
bool IsFloat32Parameter(const std::string& name);

struct CheckpointOptions {
  // Convert the floating parameters (all but the always-float32 rows) to this dtype at load;
  // float32, bfloat16 or float16. Unset: keep the checkpoint's (config.json's `dtype`).
  std::optional<torch::ScalarType> dtype;
  // Where the tensors go.
  torch::Device device = torch::kCPU;
  // kCopy (default): every tensor is read into memory, so the files may change or be truncated
  // after the load without harm. kMmap: on the CPU without conversion the tensors stay zero-copy
  // views of the mapped files; truncating a file while they are in use raises SIGBUS and kills the
  // process (see LoadMode).
  wire::LoadMode load = wire::LoadMode::kCopy;
};

// A loaded and validated checkpoint.
struct Checkpoint {
  // The backbone section; `dtype` names the tensors' dtype as loaded (options.dtype if given).
  BackboneConfig config;
  // The text of config.json that `config` was parsed from (read once, after SHA256SUMS).
  std::string config_json;
  // Every name of ExpectedParameters(config), with that shape and dtype, on options.device.
  std::unordered_map<std::string, torch::Tensor> tensors;
  // Names outside `backbone.`, skipped, sorted.
  std::vector<std::string> ignored;
  // The mapped files, held while tensors may be views of them (options.load is kMmap and
  // options.device the CPU); empty otherwise. Tensors keep their mapping alive on their own; this
  // is for IsViewOf checks.
  std::vector<std::shared_ptr<const wire::SafetensorsFile>> files;
};

// A checkpoint is untrusted input (it may come from a hub). If `dir`/SHA256SUMS exists, every file
// it lists is verified first (VerifyChecksums), and every file read below must be listed in it.
// Then reads `dir`/config.json, then `dir`/model.safetensors.index.json (`weight_map`: name ->
// shard file in `dir`) and its shards if the index exists, else `dir`/model.safetensors; only
// regular files are opened (a FIFO is refused, not waited on). Strict, in the order of the
// reference loader: an unexpected tensor under `backbone.` (first by name), then in
// ExpectedParameters order a missing tensor, a wrong shape, or a wrong dtype (a floating parameter
// must have config.json's `dtype`) is InvalidArgument naming the tensor. Names outside `backbone.`
// are ignored and counted in one line on stderr. Checksum, config and safetensors errors pass
// through (naming the file); NotFound when there is neither a single file nor an index. Tensors
// are read and converted (dtype, device) once, here; a LibTorch failure doing so is Internal.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir,
                                          const CheckpointOptions& options = {});

}  // namespace praxis::model
