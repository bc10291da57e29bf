#include "wire/step_file.h"

#include "common/status_macros.h"
#include "wire/safetensors.h"

namespace praxis::wire {

absl::StatusOr<StepInputs> ReadStepInputs(const std::string& path, int64_t frames_per_chunk) {
  PRAXIS_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  auto get = [&](const char* name) { return file->Get(name).value_or(torch::Tensor()); };
  StepInputs in;
  for (const InputField& field : kInputFields) in.*field.tensor = get(field.name);
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

}  // namespace praxis::wire
