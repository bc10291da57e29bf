#include "model/step_io.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "model/safetensors.h"

namespace praxis::model {

absl::StatusOr<StepInputs> ReadStepInputs(const std::string& path, int64_t frames_per_chunk) {
  PRAXIS_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  StepInputs in;
  auto get = [&](const char* name) { return file->Get(name).value_or(torch::Tensor()); };
  in.text = get("text");
  in.anchor = get("anchor");
  in.clean = get("clean");
  in.noised = get("noised");
  in.timesteps = get("timesteps");
  in.frames_per_chunk = frames_per_chunk;
  if (in.frames_per_chunk == 0) {
    const torch::Tensor f = get("frames_per_chunk");
    if (!f.defined() || f.numel() != 1) {
      return absl::InvalidArgumentError(
          "frames_per_chunk: give --frames_per_chunk or a one-element tensor in the inputs");
    }
    in.frames_per_chunk = f.item<int64_t>();
  }
  return in;
}

absl::StatusOr<std::array<int64_t, 4>> ParseRopeShifts(const std::string& text) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() != 4) return absl::InvalidArgumentError("--rope_shifts: expected 4 integers");
  std::array<int64_t, 4> shifts{};
  for (int i = 0; i < 4; ++i) {
    if (!absl::SimpleAtoi(parts[i], &shifts[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rope_shifts: '", parts[i], "' is not an integer"));
    }
  }
  return shifts;
}

absl::StatusOr<WindowLayout> ParseLayout(const std::string& text, const std::string& flag) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  int64_t v[5];
  bool ok = parts.size() == 5;
  for (int i = 0; ok && i < 5; ++i) ok = absl::SimpleAtoi(parts[i], &v[i]) && v[i] >= 1;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": expected five positive integers text_len,h,w,K,F, got \"", text, "\""));
  }
  return WindowLayout{.registers = 0,
                      .anchor_h = v[1],
                      .anchor_w = v[2],
                      .text_len = v[0],
                      .k = v[3],
                      .f = v[4],
                      .h = v[1],
                      .w = v[2]};
}

std::vector<std::pair<std::string, torch::Tensor>> NamedOutputs(const BackboneOutput& out) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  if (out.velocity.defined()) named.emplace_back("velocity", out.velocity);
  named.emplace_back("cond", out.cond);
  for (size_t i = 0; i < out.features.taps.size(); ++i) {
    named.emplace_back(absl::StrCat("tap.", i), out.features.taps[i]);
  }
  named.emplace_back("embeddings", out.features.embeddings);
  named.emplace_back("positions", out.features.positions);
  return named;
}

}  // namespace praxis::model
