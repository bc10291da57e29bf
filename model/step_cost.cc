#include "model/step_cost.h"

namespace praxis::model {
namespace {

// Allowed pairs of the chunk-causal rule over [globals | K noised chunks of n | K-1 clean chunks
// of n]: a global attends globals; everything else attends every global; clean chunk j attends
// clean chunks <= j; noised chunk j attends itself and clean chunks < j.
double ChunkCausalPairs(double globals, double k, double n, bool clean) {
  const double video = k * n + (clean ? (k - 1) * n : 0);
  double pairs = globals * globals + video * globals + k * n * n;  // + noised chunk j on itself
  if (clean)
    pairs += n * n * (k * (k - 1) / 2) * 2;  // clean j on clean <= j; noised j on clean < j
  return pairs;
}

// FLOPs of one block's attention over `pairs` pairs: scores and values, every head.
double AttentionFlops(const BackboneConfig& c, double pairs) {
  return 4.0 * static_cast<double>(c.head_dim()) * static_cast<double>(c.num_heads) * pairs;
}

// FLOPs of one transformer block over `tokens` tokens and `pairs` attention pairs.
double BlockFlops(const BackboneConfig& c, const TowerConfig& t, int64_t i, double tokens,
                  double pairs) {
  const double dim = c.dim, hd = c.head_dim(), h = c.num_heads, kvh = c.num_kv_heads;
  double f = 2 * tokens * dim * (h * hd + 2 * kvh * hd + h + dim) + AttentionFlops(c, pairs);
  if (t.is_moe(i)) {
    const MoeConfig& m = c.moe;
    f += 2 * tokens * dim * m.num_experts + m.top_k * 6 * tokens * dim * m.expert_dim +
         6 * tokens * dim * m.shared_dim;
  } else {
    f += 6 * tokens * dim * t.ffn_dim;
  }
  return f;
}

}  // namespace

double EncoderFlopsPerToken(const BackboneConfig& c) {
  double f = 0;
  for (int64_t i = 0; i < c.encoder.depth; ++i) f += BlockFlops(c, c.encoder, i, 1, 0);
  return f;
}

int64_t EncoderTokens(const BackboneConfig& c, const WindowLayout& l) {
  const int64_t video = l.k * l.f * l.h * l.w;
  return c.num_registers + l.anchor_h * l.anchor_w + l.text_len + video +
         (l.k - 1) * l.f * l.h * l.w;
}

int64_t DecoderTokens(const BackboneConfig& c, const WindowLayout& l) {
  return c.num_registers + l.k * l.f * l.h * c.ph() * l.w * c.pw();
}

StepCost ComputeStepCost(const BackboneConfig& c, WindowLayout l, bool decode, int64_t rows,
                         bool dense) {
  l.registers = c.num_registers;
  StepCost s;
  s.encoder_tokens = EncoderTokens(c, l);
  const double dim = c.dim, k = static_cast<double>(l.k);
  const double n = static_cast<double>(l.f * l.h * l.w);  // coarse tokens of one chunk
  const double enc = static_cast<double>(s.encoder_tokens);
  s.encoder_pairs =
      dense ? enc * enc
            : ChunkCausalPairs(
                  static_cast<double>(l.registers + l.anchor_h * l.anchor_w + l.text_len), k, n,
                  l.k > 1);
  // Input projections: video_in over anchor, noised and clean tokens; text_in's two layers;
  // video_out over the noised tokens (cond).
  double f = 2 * (l.anchor_h * l.anchor_w + n * (2 * k - 1)) * c.latent_channels() * dim +
             2.0 * l.text_len * (c.text_dim * 4 * dim + 4 * dim * dim) + 2 * k * n * dim * dim;
  for (int64_t i = 0; i < c.encoder.depth; ++i)
    f += BlockFlops(c, c.encoder, i, enc, s.encoder_pairs);
  if (decode) {
    s.decoder_tokens = DecoderTokens(c, l);
    const double dec = static_cast<double>(s.decoder_tokens);
    const double fine = k * n * c.ph() * c.pw();
    s.decoder_pairs = dense ? dec * dec
                            : ChunkCausalPairs(static_cast<double>(l.registers), k,
                                               n * c.ph() * c.pw(), /*clean=*/false);
    f += 2 * fine * c.decoder.video_in_c_in * dim * 2;  // decoder video_in and video_out
    for (int64_t i = 0; i < c.decoder.depth; ++i) {
      f += BlockFlops(c, c.decoder, i, dec, s.decoder_pairs) + 2 * k * n * dim * 2 * dim;
    }
  }
  s.flops = f * static_cast<double>(rows);
  // decoder_pairs is 0 without decode.
  s.attention_flops = (AttentionFlops(c, s.encoder_pairs) * static_cast<double>(c.encoder.depth) +
                       AttentionFlops(c, s.decoder_pairs) * static_cast<double>(c.decoder.depth)) *
                      static_cast<double>(rows);
  return s;
}

}  // namespace praxis::model
