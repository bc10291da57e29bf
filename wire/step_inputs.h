#pragma once

// The tensors of one denoising step (SPEC §2): what a StepRequest carries, a step file holds and
// the model consumes — the one list of the five inputs and their names.

#include <torch/types.h>

#include <array>
#include <cstdint>

namespace praxis::wire {

// The tensors of one step, batch-first (SPEC §2). `clean` is undefined iff K == 1. Plain data.
struct StepInputs {
  torch::Tensor text;       // [B, L, text_dim]
  torch::Tensor anchor;     // [B, C, 1, h, w]
  torch::Tensor clean;      // [B, C, (K-1)·F, h, w] or undefined
  torch::Tensor noised;     // [B, C, K·F, h, w]
  torch::Tensor timesteps;  // [B, K] in [0, 1]
  int64_t frames_per_chunk = 1;
  bool decode = true;
  std::array<int64_t, 4> rope_shifts{};  // encoder anchor, encoder text, encoder video, decoder
};

// One input tensor: its name on the wire and in step files, and where StepInputs keeps it.
struct InputField {
  const char* name;
  torch::Tensor StepInputs::*tensor;
  bool optional;  // absent for K == 1 (clean)
};

// The five inputs in wire order. Code that handles every input iterates this list instead of
// naming the tensors again.
inline constexpr InputField kInputFields[] = {
    {"text", &StepInputs::text, false},           {"anchor", &StepInputs::anchor, false},
    {"clean", &StepInputs::clean, true},          {"noised", &StepInputs::noised, false},
    {"timesteps", &StepInputs::timesteps, false},
};

// The feature sizes a model's inputs must have (ModelInfo.text_dim, .latent_channels).
struct StepDims {
  int64_t text_dim = 0;
  int64_t latent_channels = 0;
};

// The geometry of a step: what its masks, tokens and cost depend on, and what its layout key
// names. Registers are the model's, not the step's.
struct StepGeometry {
  int64_t text_len = 0;
  int64_t anchor_h = 0;
  int64_t anchor_w = 0;
  int64_t k = 1;  // chunks
  int64_t f = 1;  // frames per chunk
  int64_t h = 0;  // latent grid
  int64_t w = 0;
};

// The geometry of `in`, whose shapes must have the ranks of SPEC §2 (as after ValidateStep, or a
// step file the caller built).
inline StepGeometry GeometryOf(const StepInputs& in) {
  return {.text_len = in.text.size(1),
          .anchor_h = in.anchor.size(3),
          .anchor_w = in.anchor.size(4),
          .k = in.noised.size(2) / in.frames_per_chunk,
          .f = in.frames_per_chunk,
          .h = in.noised.size(3),
          .w = in.noised.size(4)};
}

}  // namespace praxis::wire
