#pragma once

// The work of one step, from its geometry alone (no mask is built): what the server bounds per
// request and per batch before anything is queued, and what the benchmarks count as useful FLOPs.

#include <cstdint>

#include "model/config.h"
#include "model/masks.h"

namespace praxis::model {

// Tokens, attention pairs and useful FLOPs of one step of `rows` rows.
struct StepCost {
  int64_t encoder_tokens = 0;  // per row
  int64_t decoder_tokens = 0;  // per row; 0 without decode
  double encoder_pairs = 0;    // (query, key) pairs attention computes, per row and head
  double decoder_pairs = 0;
  double flops = 0;            // all rows: every matmul, and attention over the pairs above
  double attention_flops = 0;  // all rows: the part of `flops` that is attention over the pairs

  double gflop() const { return flops / 1e9; }
};

// The cost of a step of `layout` (layout.registers is taken from `config`). With `dense`
// attention every pair of a tower is computed; otherwise only the pairs the chunk-causal rule
// allows, counted in closed form (equal to AllowedPairs over the tower's tags; a test checks it).
// Pure and cheap (no allocation): safe to call on a request thread for any validated layout.
StepCost ComputeStepCost(const BackboneConfig& config, WindowLayout layout, bool decode,
                         int64_t rows, bool dense = false);

// Useful FLOPs every encoder token costs at least (its share of the blocks' matmuls, attention not
// counted): a lower bound that turns a FLOP budget into a bound on rows x tokens.
double EncoderFlopsPerToken(const BackboneConfig& config);

// Tokens of each tower of `layout` (registers from `config`): [registers | anchor | text | noised
// | clean] and [registers | noised on the fine grid].
int64_t EncoderTokens(const BackboneConfig& config, const WindowLayout& layout);
int64_t DecoderTokens(const BackboneConfig& config, const WindowLayout& layout);

}  // namespace praxis::model
