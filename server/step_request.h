#pragma once

// A praxis.v1.StepRequest checked and turned into the model's StepInputs, before anything is
// queued: nothing a client sends reaches the batcher unless every field is consistent.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/backbone.h"
#include "model/config.h"
#include "praxis/v1/praxis.pb.h"

namespace praxis::serve {

// What the caller asked to receive, resolved against the model.
struct OutputPlan {
  bool velocity = false;
  bool cond = false;
  std::vector<int> taps;  // indices into EncoderFeatures::taps
  bool embeddings = false;
  bool positions = false;
  v1::DType wire_dtype = v1::FLOAT32;
};

// Serving limits on one request, beyond the model's own (ValidateStep): they bound the work and
// memory a single caller can ask for. Reported by GetModelInfo.
struct StepLimits {
  int64_t max_rows = 64;         // the client batch B
  int64_t max_text_len = 1024;   // L
  int64_t max_grid_h = 128;      // h of the video and of the anchor
  int64_t max_grid_w = 128;      // w of the video and of the anchor
  int64_t max_frames = 64;       // K * F
  int64_t max_tokens = 1 << 17;  // encoder or decoder sequence length
};

// A decoded, validated request.
struct DecodedStep {
  model::StepInputs inputs;
  OutputPlan outputs;
};

// Decodes and validates `request` for a model of `config`: every tensor's dtype, shape and byte
// length, K/F/h/w consistency, timestep range, finiteness, grid and text limits, decode/clean
// consistency, rope shifts, the output selection, the wire dtype, then `limits`. InvalidArgument
// naming the field, the expected and the received value.
absl::StatusOr<DecodedStep> DecodeStepRequest(const v1::StepRequest& request,
                                              const model::BackboneConfig& config,
                                              const StepLimits& limits = {});

}  // namespace praxis::serve
