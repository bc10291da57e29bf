#include "model/model_loader.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/random_weights.h"

namespace praxis::model {

absl::StatusOr<LoadedModel> LoadModel(const ModelSource& source, const BackboneOptions& options) {
  CheckpointOptions ckpt_options;
  ckpt_options.device = options.device;
  if (!source.dtype.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(ckpt_options.dtype, ParseDtype(source.dtype));
  }
  LoadedModel out;
  if (!source.checkpoint.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(source.checkpoint, ckpt_options));
    PRAXIS_ASSIGN_OR_RETURN(out.config_json,
                            ReadFileToString(JoinPath(source.checkpoint, "config.json")));
    PRAXIS_ASSIGN_OR_RETURN(out.model, VideoBackbone::Create(ckpt.config, ckpt.tensors, options));
    out.name = source.checkpoint;
    return out;
  }
  BackboneConfig config;
  if (source.config_path.empty()) {
    out.config_json = kEmbeddedTinyConfig;
    out.name = "embedded:tiny";
    PRAXIS_ASSIGN_OR_RETURN(config, ParseConfig(out.config_json));
  } else {
    PRAXIS_ASSIGN_OR_RETURN(config, LoadConfig(source.config_path));
    const std::string& p = source.config_path;
    PRAXIS_ASSIGN_OR_RETURN(out.config_json,
                            ReadFileToString(IsDirectory(p) ? JoinPath(p, "config.json") : p));
    out.name = source.config_path;
  }
  if (!source.dtype.empty()) config.dtype = source.dtype;  // random weights come in this dtype
  PRAXIS_ASSIGN_OR_RETURN(
      out.model, VideoBackbone::Create(config, RandomWeights(config, source.seed), options));
  return out;
}

absl::StatusOr<torch::Device> ParseDevice(const std::string& name) {
  try {
    return torch::Device(name);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: expected cpu, cuda or cuda:N, got \"", name, "\""));
  }
}

absl::StatusOr<AttentionMode> ParseAttention(const std::string& name) {
  if (name == "sparse") return AttentionMode::kSparse;
  if (name == "dense") return AttentionMode::kDense;
  return absl::InvalidArgumentError(
      absl::StrCat("--attention: expected sparse or dense, got \"", name, "\""));
}

}  // namespace praxis::model
