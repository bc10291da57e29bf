#include "client/request_builder.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/tensor_codec.h"

namespace praxis::client {

absl::StatusOr<v1::DType> ParseWireDtype(const std::string& name) {
  if (name == "float32") return v1::FLOAT32;
  if (name == "bfloat16") return v1::BFLOAT16;
  if (name == "float16") return v1::FLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("wire dtype: expected float32, bfloat16 or float16, got \"", name, "\""));
}

absl::StatusOr<v1::OutputSelection> ParseOutputs(const std::vector<std::string>& names) {
  v1::OutputSelection o;
  for (const std::string& n : names) {
    int tap = 0;
    if (n == "velocity") {
      o.set_velocity(true);
    } else if (n == "cond") {
      o.set_cond(true);
    } else if (n == "taps") {
      o.set_all_taps(true);
    } else if (absl::StartsWith(n, "tap.") && absl::SimpleAtoi(n.substr(4), &tap)) {
      o.add_taps(tap);
    } else if (n == "embeddings") {
      o.set_embeddings(true);
    } else if (n == "positions") {
      o.set_positions(true);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs: expected velocity, cond, taps, tap.N, embeddings or positions, got \"", n,
          "\""));
    }
  }
  return o;
}

absl::StatusOr<v1::StepRequest> MakeStepRequest(const model::StepInputs& in,
                                                const RequestOptions& options) {
  v1::StepRequest r;
  const std::pair<const torch::Tensor*, v1::Tensor*> tensors[] = {
      {&in.text, r.mutable_text()},
      {&in.anchor, r.mutable_anchor()},
      {&in.noised, r.mutable_noised()},
      {&in.timesteps, r.mutable_timesteps()}};
  for (const auto& [t, wire] : tensors) {
    PRAXIS_ASSIGN_OR_RETURN(*wire, serve::EncodeTensor(*t, options.input_dtype));
  }
  if (in.clean.defined()) {
    PRAXIS_ASSIGN_OR_RETURN(*r.mutable_clean(), serve::EncodeTensor(in.clean, options.input_dtype));
  }
  r.set_frames_per_chunk(in.frames_per_chunk);
  r.set_decode(in.decode);
  if (in.rope_shifts != std::array<int64_t, 4>{}) {
    for (int64_t s : in.rope_shifts) r.add_rope_shifts(s);
  }
  PRAXIS_ASSIGN_OR_RETURN(*r.mutable_outputs(), ParseOutputs(options.outputs));
  r.set_wire_dtype(options.wire_dtype);
  r.set_request_id(options.request_id);
  return r;
}

}  // namespace praxis::client
