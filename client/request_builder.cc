#include "client/request_builder.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/step_batch.h"
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

std::string LayoutKeyOf(const v1::StepRequest& r) {
  const auto& text = r.text().shape();
  const auto& anchor = r.anchor().shape();
  const auto& noised = r.noised().shape();
  const int64_t f = r.frames_per_chunk();
  if (text.size() != 3 || anchor.size() != 5 || noised.size() != 5 || f <= 0 ||
      (r.rope_shifts_size() != 0 && r.rope_shifts_size() != 4)) {
    return "";
  }
  const model::WindowLayout layout{.anchor_h = anchor[3],
                                   .anchor_w = anchor[4],
                                   .text_len = text[1],
                                   .k = noised[2] / f,
                                   .f = f,
                                   .h = noised[3],
                                   .w = noised[4]};
  std::array<int64_t, 4> shifts{};
  for (int i = 0; i < r.rope_shifts_size(); ++i) shifts[i] = r.rope_shifts(i);
  return model::LayoutKey(layout, r.decode(), shifts);
}

}  // namespace praxis::client
