#include "server/step_request.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/tensor_codec.h"

namespace praxis::serve {
namespace {

absl::StatusOr<OutputPlan> DecodeOutputs(const v1::StepRequest& r,
                                         const model::BackboneConfig& config) {
  OutputPlan plan;
  const v1::OutputSelection& o = r.outputs();
  const int n_taps = static_cast<int>(config.encoder.tap_blocks.size());
  plan.velocity = o.velocity();
  plan.cond = o.cond();
  plan.embeddings = o.embeddings();
  plan.positions = o.positions();
  if (o.all_taps() && o.taps_size() > 0) {
    return absl::InvalidArgumentError("outputs.taps: expected none with all_taps, got a list");
  }
  if (o.all_taps()) {
    for (int i = 0; i < n_taps; ++i) plan.taps.push_back(i);
  }
  for (int t : o.taps()) {
    if (t < 0 || t >= n_taps) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs.taps: expected indices in [0, ", n_taps, "), got ", t));
    }
    plan.taps.push_back(t);
  }
  if (plan.velocity && !r.decode()) {
    return absl::InvalidArgumentError("outputs.velocity: expected decode = true to get a velocity");
  }
  if (!plan.velocity && !plan.cond && plan.taps.empty() && !plan.embeddings && !plan.positions) {
    return absl::InvalidArgumentError("outputs: expected at least one output, got none");
  }
  const int wire = r.wire_dtype() == v1::DTYPE_UNSPECIFIED ? v1::FLOAT32 : r.wire_dtype();
  if (wire != v1::FLOAT32 && wire != v1::BFLOAT16 && wire != v1::FLOAT16) {
    return absl::InvalidArgumentError(
        absl::StrCat("wire_dtype: expected FLOAT32, BFLOAT16 or FLOAT16, got ", wire));
  }
  plan.wire_dtype = static_cast<v1::DType>(wire);
  return plan;
}

absl::Status AtMost(int64_t value, int64_t limit, const char* field, const char* what) {
  if (value <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", what, " <= ", limit, " (server limit), got ", value));
}

// Called after ValidateStep, so the shapes are known to be consistent.
absl::Status CheckLimits(const model::StepInputs& in, const model::BackboneConfig& c,
                         const StepLimits& l) {
  const int64_t b = in.noised.size(0), kf = in.noised.size(2), h = in.noised.size(3),
                w = in.noised.size(4), ah = in.anchor.size(3), aw = in.anchor.size(4),
                text = in.text.size(1);
  PRAXIS_RETURN_IF_ERROR(AtMost(b, l.max_rows, "noised", "batch rows B"));
  PRAXIS_RETURN_IF_ERROR(AtMost(text, l.max_text_len, "text", "text length L"));
  PRAXIS_RETURN_IF_ERROR(AtMost(kf, l.max_frames, "noised", "frames K*F"));
  PRAXIS_RETURN_IF_ERROR(AtMost(h, l.max_grid_h, "noised", "grid height h"));
  PRAXIS_RETURN_IF_ERROR(AtMost(w, l.max_grid_w, "noised", "grid width w"));
  PRAXIS_RETURN_IF_ERROR(AtMost(ah, l.max_grid_h, "anchor", "grid height"));
  PRAXIS_RETURN_IF_ERROR(AtMost(aw, l.max_grid_w, "anchor", "grid width"));
  const int64_t clean = in.clean.defined() ? in.clean.size(2) * h * w : 0;
  const int64_t encoder = c.num_registers + ah * aw + text + kf * h * w + clean;
  const int64_t decoder = c.num_registers + kf * h * c.ph() * w * c.pw();
  PRAXIS_RETURN_IF_ERROR(AtMost(encoder, l.max_tokens, "noised", "encoder tokens"));
  return AtMost(decoder, l.max_tokens, "noised", "decoder tokens");
}

}  // namespace

absl::StatusOr<DecodedStep> DecodeStepRequest(const v1::StepRequest& r,
                                              const model::BackboneConfig& config,
                                              const StepLimits& limits) {
  DecodedStep step;
  model::StepInputs& in = step.inputs;
  if (!r.has_text() || !r.has_anchor() || !r.has_noised() || !r.has_timesteps()) {
    const char* missing = !r.has_text()     ? "text"
                          : !r.has_anchor() ? "anchor"
                          : !r.has_noised() ? "noised"
                                            : "timesteps";
    return absl::InvalidArgumentError(absl::StrCat(missing, ": expected a tensor, got none"));
  }
  PRAXIS_ASSIGN_OR_RETURN(in.text, DecodeTensor(r.text(), "text"));
  PRAXIS_ASSIGN_OR_RETURN(in.anchor, DecodeTensor(r.anchor(), "anchor"));
  PRAXIS_ASSIGN_OR_RETURN(in.noised, DecodeTensor(r.noised(), "noised"));
  PRAXIS_ASSIGN_OR_RETURN(in.timesteps, DecodeTensor(r.timesteps(), "timesteps"));
  if (r.has_clean()) {
    PRAXIS_ASSIGN_OR_RETURN(in.clean, DecodeTensor(r.clean(), "clean"));
  }
  if (r.frames_per_chunk() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("frames_per_chunk: expected >= 1, got ", r.frames_per_chunk()));
  }
  in.frames_per_chunk = r.frames_per_chunk();
  in.decode = r.decode();
  if (r.rope_shifts_size() != 0 && r.rope_shifts_size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_shifts: expected 0 or 4 values, got ", r.rope_shifts_size()));
  }
  for (int i = 0; i < r.rope_shifts_size(); ++i) in.rope_shifts[i] = r.rope_shifts(i);
  PRAXIS_ASSIGN_OR_RETURN(step.outputs, DecodeOutputs(r, config));
  PRAXIS_RETURN_IF_ERROR(model::ValidateStep(config, in));
  PRAXIS_RETURN_IF_ERROR(CheckLimits(in, config, limits));
  return step;
}

}  // namespace praxis::serve
