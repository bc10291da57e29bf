#include "client/request_builder.h"

#include "common/status_macros.h"
#include "wire/layout_key.h"
#include "wire/selection.h"
#include "wire/step_codec.h"

namespace praxis::client {

absl::StatusOr<v1::StepRequest> MakeStepRequest(const wire::StepInputs& in,
                                                const RequestOptions& options) {
  v1::StepRequest r;
  PRAXIS_RETURN_IF_ERROR(wire::EncodeInputTensors(in, options.input_dtype, &r));
  r.set_frames_per_chunk(in.frames_per_chunk);
  r.set_decode(in.decode);
  if (in.rope_shifts != std::array<int64_t, 4>{}) {
    for (int64_t s : in.rope_shifts) r.add_rope_shifts(s);
  }
  PRAXIS_ASSIGN_OR_RETURN(*r.mutable_outputs(), wire::ParseOutputs(options.outputs));
  r.set_wire_dtype(options.wire_dtype);
  r.set_request_id(options.request_id);
  r.set_whole_answer(options.whole_answer);
  return r;
}

wire::StepDims StepDimsOf(const v1::ModelInfo& info) {
  return {.text_dim = info.text_dim(), .latent_channels = info.latent_channels()};
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
  const wire::StepGeometry layout{.text_len = text[1],
                                  .anchor_h = anchor[3],
                                  .anchor_w = anchor[4],
                                  .k = noised[2] / f,
                                  .f = f,
                                  .h = noised[3],
                                  .w = noised[4]};
  std::array<int64_t, 4> shifts{};
  for (int i = 0; i < r.rope_shifts_size(); ++i) shifts[i] = r.rope_shifts(i);
  return wire::LayoutKey(layout, r.decode(), shifts);
}

}  // namespace praxis::client
