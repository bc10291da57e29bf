#include "server/step_request.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/masks.h"
#include "model/step_validation.h"
#include "wire/step_codec.h"
#include "wire/tensor_codec.h"

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
  std::vector<bool> seen(n_taps, false);
  for (int t : o.taps()) {
    if (t < 0 || t >= n_taps) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs.taps: expected indices in [0, ", n_taps, "), got ", t));
    }
    if (seen[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs.taps: expected each index once, got ", t, " again"));
    }
    seen[t] = true;
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
  plan.whole_answer = r.whole_answer();
  return plan;
}

absl::Status AtMost(int64_t value, int64_t limit, const char* field, const char* what) {
  if (value <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", what, " <= ", limit, " (server limit), got ", value));
}

// Called after ValidateStep, so the shapes are known to be consistent (and their products, each
// bounded by a tensor's element count, cannot overflow).
absl::Status CheckLimits(const model::StepInputs& in, const model::BackboneConfig& c,
                         const StepLimits& l) {
  const model::WindowLayout layout = model::StepLayout(in);
  PRAXIS_RETURN_IF_ERROR(AtMost(in.noised.size(0), l.max_rows, "noised", "batch rows B"));
  PRAXIS_RETURN_IF_ERROR(AtMost(layout.text_len, l.max_text_len, "text", "text length L"));
  PRAXIS_RETURN_IF_ERROR(AtMost(layout.k * layout.f, l.max_frames, "noised", "frames K*F"));
  PRAXIS_RETURN_IF_ERROR(AtMost(layout.h, l.max_grid_h, "noised", "grid height h"));
  PRAXIS_RETURN_IF_ERROR(AtMost(layout.w, l.max_grid_w, "noised", "grid width w"));
  PRAXIS_RETURN_IF_ERROR(AtMost(layout.anchor_h, l.max_grid_h, "anchor", "grid height"));
  PRAXIS_RETURN_IF_ERROR(AtMost(layout.anchor_w, l.max_grid_w, "anchor", "grid width"));
  PRAXIS_RETURN_IF_ERROR(
      AtMost(model::EncoderTokens(c, layout), l.max_tokens, "noised", "encoder tokens"));
  return AtMost(model::DecoderTokens(c, layout), l.max_tokens, "noised", "decoder tokens");
}

// Every float input within +-max_abs_input (from ValidateStep's pass): huge finite values (3e38)
// would come back as inf or NaN with status OK.
absl::Status CheckMagnitude(const model::InputMagnitudes& found, double max_abs) {
  for (size_t i = 0; i < found.max_abs.size(); ++i) {
    const double m = found.max_abs[i];
    if (!(m <= max_abs)) {
      return absl::InvalidArgumentError(absl::StrCat(wire::kInputFields[i].name,
                                                     ": expected values within +-", max_abs,
                                                     " (server limit), got ", m));
    }
  }
  return absl::OkStatus();
}

// The tensor bytes of the answer `plan` asks for (SPEC §2 shapes, float outputs in the wire dtype).
int64_t ResponseBytes(const OutputPlan& plan, const model::BackboneConfig& c,
                      const model::StepInputs& in, const model::StepCost& cost) {
  const int64_t b = in.noised.size(0), video = in.noised.numel() / in.noised.size(1);
  // DecodeOutputs accepted the wire dtype, so it has a torch dtype.
  const int64_t wire =
      static_cast<int64_t>(c10::elementSize(*wire::FromWireDtype(plan.wire_dtype, "")));
  const int64_t features = b * cost.encoder_tokens * c.dim * wire;  // one tap, or embeddings
  return (plan.velocity ? in.noised.numel() * wire : 0) + (plan.cond ? video * c.dim * wire : 0) +
         static_cast<int64_t>(plan.taps.size()) * features + (plan.embeddings ? features : 0) +
         (plan.positions ? b * cost.encoder_tokens * 8 : 0);
}

// What the request will cost the server: refused RESOURCE_EXHAUSTED before it is queued.
absl::Status CheckBudget(const DecodedStep& s, const StepLimits& l) {
  if (l.dense_attention) {
    const int64_t t = std::max(s.cost.encoder_tokens, s.cost.decoder_tokens);
    if (t * t > l.max_dense_mask_bytes) {  // t <= max_tokens, so t * t fits
      return absl::ResourceExhaustedError(
          absl::StrCat("noised: dense attention over ", t, " tokens needs a ", t * t,
                       "-byte mask, over --max_dense_mask_bytes=", l.max_dense_mask_bytes));
    }
  }
  if (s.cost.gflop() > l.max_request_gflop) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request cost ", s.cost.gflop(), " GFLOP is over --max_request_cost=", l.max_request_gflop,
        " GFLOP: send fewer rows, frames or a smaller grid"));
  }
  if (s.outputs.response_bytes > l.max_response_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("outputs: the answer would carry ", s.outputs.response_bytes,
                     " bytes, over --max_response_bytes=", l.max_response_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<DecodedStep> Decode(const v1::StepRequest& r, const model::BackboneConfig& config,
                                   const StepLimits& limits, const torch::Tensor& kept_text) {
  DecodedStep step;
  model::StepInputs& in = step.inputs;
  const bool reused = !r.has_text() && kept_text.defined();
  if (reused) in.text = kept_text;
  PRAXIS_RETURN_IF_ERROR(wire::DecodeInputTensors(r, &in));
  if (reused && in.noised.dim() > 0 && in.text.size(0) != in.noised.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "text: left out, so the session's kept text is used, but it has ", in.text.size(0),
        " rows and noised has ", in.noised.size(0), ": send text with this step"));
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
  model::InputMagnitudes magnitudes;
  PRAXIS_RETURN_IF_ERROR(model::ValidateStep(config, in, &magnitudes));
  PRAXIS_RETURN_IF_ERROR(CheckLimits(in, config, limits));
  PRAXIS_RETURN_IF_ERROR(CheckMagnitude(magnitudes, limits.max_abs_input));
  step.cost = model::ComputeStepCost(config, model::StepLayout(in), in.decode, in.noised.size(0),
                                     limits.dense_attention);
  step.outputs.response_bytes = ResponseBytes(step.outputs, config, in, step.cost);
  PRAXIS_RETURN_IF_ERROR(CheckBudget(step, limits));
  return step;
}

}  // namespace

MessageBounds LargestLegalStep(const model::BackboneConfig& c, const StepLimits& l) {
  const double by_cost = l.max_request_gflop * 1e9 / model::EncoderFlopsPerToken(c);
  const double by_shape = static_cast<double>(l.max_rows) * static_cast<double>(l.max_tokens);
  const double row_tokens = std::min(by_cost, by_shape);
  const int64_t overhead = 64 << 10;  // proto framing, timesteps, small fields
  const double in = row_tokens * std::max(c.latent_channels(), c.text_dim) * 4;
  const double out =
      row_tokens * ((static_cast<double>(c.encoder.tap_blocks.size()) + 2) * c.dim * 4 + 8 +
                    c.latent_channels() * 4);
  auto clamp = [](double b) { return static_cast<int64_t>(std::min(b, 1e18)); };
  return {clamp(in) + overhead, clamp(out)};
}

absl::StatusOr<DecodedStep> DecodeStepRequest(const v1::StepRequest& r,
                                              const model::BackboneConfig& config,
                                              const StepLimits& limits,
                                              const torch::Tensor& kept_text) {
  try {  // the torch boundary: nothing a client sends may throw through the request path
    return Decode(r, config, limits, kept_text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("request: cannot be decoded: ", e.what()));
  }
}

}  // namespace praxis::serve
