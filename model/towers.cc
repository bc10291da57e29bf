#include "model/towers.h"

#include <cmath>
#include <utility>

#include "model/attention.h"

namespace praxis::model {
namespace {

torch::ScalarType ModulationDtype(const BackboneConfig& c) {
  return *ParseDtype(c.modulation_dtype);
}

// (shift, 1 + scale_raw) of flow times t [...] in the modulation dtype, each [..., dim].
std::pair<torch::Tensor, torch::Tensor> TimeModulation(const BackboneConfig& c,
                                                       const TowerWeights& w,
                                                       const torch::Tensor& t) {
  const torch::Tensor mod = Linear(FourierFeatures(t, w.freqs, w.phases), w.t_proj_w, w.t_proj_b);
  const auto parts = mod.split(c.dim, -1);
  const torch::ScalarType mdt = ModulationDtype(c);
  return {parts[0].to(mdt), 1.0 + parts[1].to(mdt)};
}

// Chunk k of tokens [B, K·chunk_tokens, dim] modulated with timesteps[:, k].
torch::Tensor ModulateChunks(const BackboneConfig& c, const TowerWeights& w,
                             const torch::Tensor& tokens, const torch::Tensor& timesteps,
                             int64_t chunk_tokens) {
  auto [shift, scale] = TimeModulation(c, w, timesteps);
  return Modulate(tokens, shift.repeat_interleave(chunk_tokens, 1),
                  scale.repeat_interleave(chunk_tokens, 1), ModulationDtype(c));
}

torch::Tensor Attention(const TowerContext& ctx, const BlockWeights& bw,
                        const torch::Tensor& u_in) {
  const BackboneConfig& c = ctx.config;
  const torch::Tensor u = u_in.to(bw.q.scalar_type());
  const int64_t b = u.size(0), t = u.size(1), hd = c.head_dim();
  torch::Tensor q = torch::linear(u, bw.q).view({b, t, c.num_heads, hd});
  torch::Tensor k = torch::linear(u, bw.k).view({b, t, c.num_kv_heads, hd});
  torch::Tensor v = torch::linear(u, bw.v).view({b, t, c.num_kv_heads, hd});
  if (c.qk_norm) {
    q = RmsNorm(q, bw.q_norm, c.norm_eps);
    k = RmsNorm(k, bw.k_norm, c.norm_eps);
  }
  // kv head j serves the `group` consecutive query heads j·group, ..., j·group + group - 1.
  const int64_t group = c.num_heads / c.num_kv_heads;
  q = ApplyRope(q, ctx.rope).transpose(1, 2);
  k = ApplyRope(k, ctx.rope).transpose(1, 2).repeat_interleave(group, 1);
  v = v.transpose(1, 2).repeat_interleave(group, 1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  torch::Tensor o = ctx.mode == AttentionMode::kSparse
                        ? SparseAttention(q, k, v, ctx.mask.plan, scale)
                        : DenseAttention(q, k, v, ctx.mask.dense, scale);
  const torch::Tensor g = torch::sigmoid(Linear(u, bw.gate_w, bw.gate_b));
  o = (o.transpose(1, 2) * g.unsqueeze(-1)).reshape({b, t, c.num_heads * hd});
  return Linear(o, bw.out_w, bw.out_b);
}

torch::Tensor Block(const TowerContext& ctx, const BlockWeights& bw, torch::Tensor x) {
  const BackboneConfig& c = ctx.config;
  x = x + Attention(ctx, bw, RmsNorm(x, bw.norm1, c.norm_eps) * bw.scale);
  const torch::Tensor u = RmsNorm(x, bw.norm2, c.norm_eps) * bw.scale;
  return x + (bw.moe ? Moe(u, bw.moe_w, c.moe.top_k, c.routed_scale)
                     : SwiGlu(u, bw.ffn_a, bw.ffn_b, bw.ffn_down));
}

torch::Tensor TextIn(const BackboneConfig& c, const EncoderWeights& w, const torch::Tensor& text) {
  torch::Tensor x = Linear(text, w.text_fc1_w, w.text_fc1_b);
  x = torch::gelu(x, c.gelu_approximate == "tanh" ? "tanh" : "none");
  return RmsNorm(Linear(x, w.text_fc2_w, w.text_fc2_b), w.text_norm, c.norm_eps);
}

}  // namespace

EncoderResult RunEncoder(const EncoderWeights& w, const TowerContext& ctx,
                         const torch::Tensor& text, const torch::Tensor& anchor,
                         const torch::Tensor& clean, const torch::Tensor& noised,
                         const torch::Tensor& timesteps, int64_t frames_per_chunk) {
  const BackboneConfig& c = ctx.config;
  const TowerWeights& tw = w.tower;
  const torch::ScalarType dt = tw.registers.scalar_type();
  const int64_t b = noised.size(0), kf = noised.size(2), h = noised.size(3), wd = noised.size(4);
  auto video_in = [&](const torch::Tensor& x) {
    return Linear(VideoTokens(x), tw.video_in_w, tw.video_in_b);
  };
  std::vector<torch::Tensor> parts = {
      tw.registers.unsqueeze(0).expand({b, -1, -1}), video_in(anchor), TextIn(c, w, text),
      ModulateChunks(c, tw, video_in(noised), timesteps, frames_per_chunk * h * wd)};
  if (clean.defined()) {
    auto [shift, scale] = TimeModulation(
        c, tw, torch::full({b, 1}, c.clean_timestep, timesteps.options().dtype(torch::kFloat32)));
    parts.push_back(Modulate(video_in(clean), shift, scale, ModulationDtype(c)));
  }
  for (torch::Tensor& p : parts) p = p.to(dt);
  EncoderResult out;
  torch::Tensor x = torch::cat(parts, 1);
  out.embeddings = x;
  const auto& taps = c.encoder.tap_blocks;
  std::vector<torch::Tensor> by_block(tw.blocks.size());
  for (size_t i = 0; i < tw.blocks.size(); ++i) {
    x = Block(ctx, tw.blocks[i], x);
    by_block[i] = x;
  }
  for (int64_t i : taps) out.taps.push_back(by_block[i]);
  const int64_t noised_start = c.num_registers + anchor.size(3) * anchor.size(4) + text.size(1);
  out.cond = Linear(x.narrow(1, noised_start, kf * h * wd), w.enc_out_w, w.enc_out_b)
                 .reshape({b, kf, h, wd, c.dim});
  return out;
}

torch::Tensor RunDecoder(const DecoderWeights& w, const TowerContext& ctx,
                         const torch::Tensor& noised, const torch::Tensor& cond,
                         const torch::Tensor& timesteps, int64_t frames_per_chunk) {
  const BackboneConfig& c = ctx.config;
  const TowerWeights& tw = w.tower;
  const int64_t ph = c.ph(), pw = c.pw(), r = c.num_registers;
  const int64_t b = noised.size(0), kf = noised.size(2);
  const int64_t hh = noised.size(3) * ph, ww = noised.size(4) * pw;
  const torch::ScalarType mdt = ModulationDtype(c);
  const torch::Tensor u = VideoTokens(Unpatch(noised, ph, pw));
  const torch::Tensor v = ModulateChunks(c, tw, Linear(u, tw.video_in_w, tw.video_in_b), timesteps,
                                         frames_per_chunk * hh * ww);
  torch::Tensor x = torch::cat(
      {tw.registers.unsqueeze(0).expand({b, -1, -1}), v.to(tw.registers.scalar_type())}, 1);
  for (const BlockWeights& bw : tw.blocks) {
    // The per-token modulation runs on the coarse grid, then repeats over each ph x pw patch.
    const torch::Tensor mod = Linear(cond, bw.mod_w, bw.mod_b)
                                  .repeat_interleave(ph, 2)
                                  .repeat_interleave(pw, 3)
                                  .reshape({b, kf * hh * ww, -1});
    const auto sr = mod.split(c.dim, -1);
    const torch::Tensor xv =
        Modulate(x.narrow(1, r, kf * hh * ww), sr[0].to(mdt), 1.0 + sr[1].to(mdt), mdt);
    x = Block(ctx, bw, torch::cat({x.narrow(1, 0, r), xv}, 1));
  }
  torch::Tensor y =
      Linear(RmsNorm(x.narrow(1, r, kf * hh * ww), w.norm, c.norm_eps), w.out_w, w.out_b);
  y = y.reshape({b, kf, hh, ww, -1}).permute({0, 4, 1, 2, 3});
  return Patchify(y, ph, pw);
}

}  // namespace praxis::model
