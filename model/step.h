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

// Every output of `out` under its streamed name (wire/output_names.h), in streaming order:
// velocity (with decode), cond, tap.0 …, embeddings, positions.
std::vector<std::pair<std::string, torch::Tensor>> NamedOutputs(const BackboneOutput& out);

}  // namespace praxis::model
