// praxis-forward: runs one backbone step outside the server, from and to safetensors files, so
// that any served step can be reproduced (and compared with the PyTorch reference).

#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/usage.h"
#include "model/backbone.h"
#include "model/model_loader.h"
#include "wire/layout_key.h"
#include "wire/safetensors.h"
#include "wire/step_file.h"

ABSL_FLAG(std::string, checkpoint, "", "checkpoint directory (config.json + safetensors)");
ABSL_FLAG(std::string, config, "",
          "config.json for a model with deterministic random weights (--seed); not used with "
          "--checkpoint, whose own config.json describes it");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights when no --checkpoint is given");
ABSL_FLAG(std::string, load, "copy",
          "copy | mmap: read the checkpoint into memory, or map it (SIGBUS if the file shrinks)");
ABSL_FLAG(std::string, inputs, "", "safetensors with text, anchor, [clean], noised, timesteps");
ABSL_FLAG(std::string, out, "",
          "safetensors to write: velocity, cond, tap.N, embeddings, positions");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | cuda:N");
ABSL_FLAG(std::string, dtype, "",
          "parameter dtype to convert to at load (default: the checkpoint's); a 16-bit one is "
          "computed, and written, in float32 where its GEMM is the slower one "
          "(PRAXIS_REDUCED_GEMM_IN_FLOAT32=0 keeps it)");
ABSL_FLAG(std::string, attention, "sparse", "sparse | dense");
ABSL_FLAG(std::string, rope_shifts, "0,0,0,0",
          "encoder anchor, encoder text, encoder video, decoder");
ABSL_FLAG(int64_t, frames_per_chunk, 0,
          "latent frames per chunk (default: the inputs' frames_per_chunk tensor)");
ABSL_FLAG(bool, decode, true, "run the decoder tower");
ABSL_FLAG(int32_t, threads, 2, "LibTorch intra-op threads");

namespace praxis::model {
namespace {

absl::StatusOr<StepInputs> ReadInputs(const std::string& path) {
  PRAXIS_ASSIGN_OR_RETURN(StepInputs in,
                          wire::ReadStepInputs(path, absl::GetFlag(FLAGS_frames_per_chunk)));
  PRAXIS_ASSIGN_OR_RETURN(in.rope_shifts,
                          wire::ParseRopeShifts(absl::GetFlag(FLAGS_rope_shifts), "--rope_shifts"));
  in.decode = absl::GetFlag(FLAGS_decode);
  return in;
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_checkpoint).empty() && absl::GetFlag(FLAGS_config).empty()) {
    return absl::InvalidArgumentError("give --checkpoint or --config");
  }
  BackboneOptions options;
  PRAXIS_ASSIGN_OR_RETURN(options.device, ParseDevice(absl::GetFlag(FLAGS_device), "--device"));
  PRAXIS_ASSIGN_OR_RETURN(options.attention,
                          ParseAttention(absl::GetFlag(FLAGS_attention), "--attention"));
  torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  const ModelSource source{.checkpoint = absl::GetFlag(FLAGS_checkpoint),
                           .config_path = absl::GetFlag(FLAGS_config),
                           .seed = absl::GetFlag(FLAGS_seed),
                           .dtype = absl::GetFlag(FLAGS_dtype),
                           .load = absl::GetFlag(FLAGS_load)};
  PRAXIS_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(source, options));
  VideoBackbone* model = loaded.model.get();
  PRAXIS_ASSIGN_OR_RETURN(StepInputs in, ReadInputs(absl::GetFlag(FLAGS_inputs)));
  PRAXIS_ASSIGN_OR_RETURN(BackboneOutput out, model->Forward(in));
  std::vector<std::pair<std::string, torch::Tensor>> tensors = NamedOutputs(out);
  for (auto& [name, t] : tensors) t = t.to(torch::kCPU).contiguous();
  const auto& f = out.features;
  std::map<std::string, std::string> metadata = {
      {"noised_span", absl::StrCat(f.noised_span.start, ",", f.noised_span.length)},
      {"frames_per_chunk", absl::StrCat(f.frames_per_chunk)},
      {"tokens_per_frame", absl::StrCat(f.tokens_per_frame)},
      {"n_chunks", absl::StrCat(f.n_chunks)}};
  return wire::WriteSafetensors(absl::GetFlag(FLAGS_out), tensors, metadata);
}

}  // namespace
}  // namespace praxis::model

int main(int argc, char** argv) {
  praxis::SetUsage("praxis-forward --checkpoint DIR --inputs in.safetensors --out out.safetensors");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = praxis::model::Run();
  if (!status.ok()) {
    std::cerr << "praxis-forward: " << status << "\n";
    return 2;
  }
  return 0;
}
