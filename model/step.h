#pragma once

// What one denoising step takes and gives, as plain data (no attention or cache headers): the
// inputs are the wire's (wire/step_inputs.h), the outputs the model's.

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "wire/step_inputs.h"

namespace praxis::model {

using wire::StepInputs;

// (start, length) of a run of the encoder sequence.
struct Span {
  int64_t start = 0;
  int64_t length = 0;
};

// Encoder outputs that the action expert reads.
struct EncoderFeatures {
  std::vector<torch::Tensor> taps;  // one [B, T, dim] per tap block, in tap_blocks order
  torch::Tensor embeddings;         // block-0 input [B, T, dim]
  torch::Tensor positions;          // [B, T] int64
  Span register_span, anchor_span, text_span, noised_span;
  std::optional<Span> clean_span;  // absent for K == 1
  int64_t frames_per_chunk = 0;
  int64_t tokens_per_frame = 0;
  int64_t n_chunks = 0;
};

// The result of one step.
struct BackboneOutput {
  torch::Tensor velocity;  // [B, C, K·F, h, w]; undefined without decode
  torch::Tensor cond;      // encoder conditioning [B, K·F, h, w, dim]
  EncoderFeatures features;
};

// Which outputs a batch must return: what its callers asked for, together. A runner leaves the
// others undefined and never copies or converts them (server/step_request.h's OutputPlan is one
// caller's selection plus its wire form).
struct OutputSelection {
  bool velocity = false;  // only with decode
  bool cond = false;
  std::vector<int> taps = {};  // indices into EncoderFeatures::taps, each once
  bool embeddings = false;
  bool positions = false;

  // Every output of a model with `n_taps` tap blocks (warm-up, tools and tests).
  static OutputSelection All(int n_taps);
};

// The outputs any of `selections` asks for (what a batch must produce), taps ascending.
OutputSelection WantedByAny(const std::vector<const OutputSelection*>& selections);
// The outputs every one of `selections` asks for, taps ascending; all of them for none.
OutputSelection WantedByAll(const std::vector<const OutputSelection*>& selections);

// Each output slot of `out` (velocity, cond, taps in order, embeddings, positions) with whether
// `wanted` selects it: the one place that maps a selection onto a BackboneOutput. The pointers
// point into `out`.
std::vector<std::pair<torch::Tensor*, bool>> OutputSlots(BackboneOutput& out,
                                                         const OutputSelection& wanted);

// Releases every output of `out` that `wanted` does not select (left undefined; taps keep their
// indices). Spans and counts stay.
void KeepOnly(BackboneOutput& out, const OutputSelection& wanted);

// Every defined output of `out` under its streamed name (wire/output_names.h), in streaming order:
// velocity (with decode), cond, tap.0 …, embeddings, positions.
std::vector<std::pair<std::string, torch::Tensor>> NamedOutputs(const BackboneOutput& out);

}  // namespace praxis::model
