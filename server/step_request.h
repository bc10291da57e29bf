#pragma once

// A praxis.v1.StepRequest checked and turned into the model's StepInputs, before anything is
// queued: nothing a client sends reaches the batcher unless every field is consistent.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/backbone.h"
#include "model/config.h"
#include "model/step.h"
#include "model/step_cost.h"
#include "praxis/v1/praxis.pb.h"

namespace praxis::serve {

// What the caller asked to receive, resolved against the model: the outputs (the selection the
// runner gets, merged with the batch's other callers'; taps in the order asked) and their wire
// form.
struct OutputPlan : model::OutputSelection {
  v1::DType wire_dtype = v1::FLOAT32;
  int64_t response_bytes = 0;  // the tensor bytes the answer will carry
  bool whole_answer = false;   // one StepAnswer message where it fits (StepRequest.whole_answer)
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
  double max_abs_input = 1e4;    // |x| of every float input (NaN and inf fail it too)
  // Useful GFLOP of one request (model::StepCost): bounds the time one caller can take from the
  // workers. The default runs in about a second on the embedded tiny model on 2 CPU cores.
  double max_request_gflop = 100;
  int64_t max_response_bytes = int64_t{1} << 30;  // tensor bytes of one answer
  // With dense attention (the model computes every pair): the larger tower's [T, T] bool mask.
  bool dense_attention = false;
  int64_t max_dense_mask_bytes = int64_t{64} << 20;
};

// A decoded, validated request.
struct DecodedStep {
  model::StepInputs inputs;
  OutputPlan outputs;
  model::StepCost cost;  // of all its rows
};

// The bytes of the largest request DecodeStepRequest can accept under `limits` (every input
// element belongs to an encoder token, and the cost bound caps rows x tokens), and of its answer:
// the defaults of --max_message_bytes and --max_response_bytes for the loaded model.
struct MessageBounds {
  int64_t request_bytes = 0;
  int64_t response_bytes = 0;
};
MessageBounds LargestLegalStep(const model::BackboneConfig& config, const StepLimits& limits);

// Decodes and validates `request` for a model of `config`: every tensor's dtype, shape and byte
// length, K/F/h/w consistency, timestep range, finiteness, grid and text limits, decode/clean
// consistency, rope shifts, the output selection (no duplicate), the wire dtype, then `limits`.
// InvalidArgument naming the field, the expected and the received value; ResourceExhausted naming
// the limit when the request is valid but over its compute cost or answer size. Never throws.
// `kept_text` (a Session's, or undefined) stands in for a request that leaves text out; it is
// checked as a sent one would be.
absl::StatusOr<DecodedStep> DecodeStepRequest(const v1::StepRequest& request,
                                              const model::BackboneConfig& config,
                                              const StepLimits& limits = {},
                                              const torch::Tensor& kept_text = {});

}  // namespace praxis::serve
