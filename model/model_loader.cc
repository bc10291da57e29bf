#include "model/model_loader.h"

#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/random_weights.h"

namespace praxis::model {

namespace {

absl::StatusOr<LoadedModel> Load(const ModelSource& source, const BackboneOptions& options) {
  CheckpointOptions ckpt_options;
  ckpt_options.device = options.device;
  if (!source.dtype.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(ckpt_options.dtype, ParseDtype(source.dtype));
  }
  if (!source.load.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(ckpt_options.load, wire::ParseLoadMode(source.load));
  }
  LoadedModel out;
  if (!source.checkpoint.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(Checkpoint ckpt, LoadCheckpoint(source.checkpoint, ckpt_options));
    out.config_json = std::move(ckpt.config_json);
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
    const std::string& p = source.config_path;
    const std::string file = IsDirectory(p) ? JoinPath(p, "config.json") : p;
    PRAXIS_ASSIGN_OR_RETURN(out.config_json, ReadRegularFile(file, kMaxConfigBytes));
    absl::StatusOr<BackboneConfig> parsed = ParseConfig(out.config_json);
    if (!parsed.ok()) {
      return absl::Status(parsed.status().code(),
                          absl::StrCat(file, ": ", parsed.status().message()));
    }
    config = *std::move(parsed);
    out.name = source.config_path;
  }
  if (!source.dtype.empty()) config.dtype = source.dtype;  // random weights come in this dtype
  PRAXIS_ASSIGN_OR_RETURN(
      out.model, VideoBackbone::Create(config, RandomWeights(config, source.seed), options));
  return out;
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const ModelSource& source, const BackboneOptions& options) {
  // RandomWeights allocates every parameter; a config within its bounds can still be more than
  // this machine holds.
  try {
    return Load(source, options);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("loading the model: out of memory");
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading the model: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading the model: ", e.what()));
  }
}

absl::StatusOr<torch::Device> ParseDevice(const std::string& name, absl::string_view field) {
  try {
    return torch::Device(name);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected cpu, cuda or cuda:N, got \"", name, "\""));
  }
}

absl::StatusOr<AttentionMode> ParseAttention(const std::string& name, absl::string_view field) {
  if (name == "sparse") return AttentionMode::kSparse;
  if (name == "dense") return AttentionMode::kDense;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected sparse or dense, got \"", name, "\""));
}

}  // namespace praxis::model
