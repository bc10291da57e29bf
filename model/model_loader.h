#pragma once

// Where a served or benchmarked model comes from: a checkpoint directory, or a config with
// deterministic random weights (the embedded tiny model when neither is given).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/backbone.h"

namespace praxis::model {

// configs/tiny.json, compiled in: the default model of praxis-server.
extern const char kEmbeddedTinyConfig[];

struct ModelSource {
  std::string checkpoint;   // a checkpoint directory; when empty, random weights for:
  std::string config_path;  // a config.json (or a directory holding one); empty: embedded tiny
  uint64_t seed = 0;        // of the random weights
  std::string dtype;        // "float32" | "bfloat16" | "float16"; empty keeps the config's
  std::string load;         // checkpoint load mode (LoadMode): "copy" | "mmap"; empty is copy
};

// A model ready to run, with what describes it.
struct LoadedModel {
  std::unique_ptr<VideoBackbone> model;
  std::string name;         // the checkpoint directory, the config path, or "embedded:tiny"
  std::string config_json;  // the config.json text it was built from
};

// Loads `source` onto options.device. The errors of LoadCheckpoint, LoadConfig, ParseDtype and
// ParseLoadMode, naming the file or field; a LibTorch exception building the model (out of memory)
// becomes ResourceExhausted or Internal, never an escape.
absl::StatusOr<LoadedModel> LoadModel(const ModelSource& source, const BackboneOptions& options);

// "cpu" | "cuda" | "cuda:N"; InvalidArgument naming `field` (the caller's flag) otherwise.
absl::StatusOr<torch::Device> ParseDevice(const std::string& name, absl::string_view field);
// "sparse" | "dense"; InvalidArgument naming `field` otherwise.
absl::StatusOr<AttentionMode> ParseAttention(const std::string& name, absl::string_view field);

}  // namespace praxis::model
