#include "model/towers.h"

#include <ATen/record_function.h>

#include <cmath>
#include <utility>
#include <vector>

#include "model/attention.h"
#include "model/cpu_kernels.h"

namespace praxis::model {
namespace {

torch::ScalarType ModulationDtype(const BackboneConfig& c) {
  return *ParseDtype(c.modulation_dtype);
}

// (shift, 1 + scale_raw) in the modulation dtype, each [..., dim], from a modulation projection's
// output mod [..., 2·dim]. On the CPU in float32 in one pass (a B1 step's smallest ops cost their
// dispatches, not their arithmetic).
std::pair<torch::Tensor, torch::Tensor> ShiftAndScale(const BackboneConfig& c,
                                                      const torch::Tensor& mod) {
  const torch::ScalarType mdt = ModulationDtype(c);
  if (!mod.is_cuda() && mdt == torch::kFloat32) return cpu::ShiftAndScale(mod);
  const auto parts = mod.split(c.dim, -1);
  return {parts[0].to(mdt), 1.0 + parts[1].to(mdt)};
}

// (shift, 1 + scale_raw) of flow times t [...] in the modulation dtype, each [..., dim].
std::pair<torch::Tensor, torch::Tensor> TimeModulation(const BackboneConfig& c,
                                                       const TowerWeights& w,
                                                       const torch::Tensor& t) {
  // On the CPU the features come in one pass, in the projection's dtype.
  const torch::Tensor features =
      t.is_cuda() ? FourierFeatures(t, w.freqs, w.phases)
                  : cpu::FourierFeatures(t, w.freqs, w.phases, w.t_proj_w.scalar_type());
  return ShiftAndScale(c, Linear(features, w.t_proj_w, w.t_proj_b));
}

// Chunk k of tokens [B, K·chunk_tokens, dim] modulated with timesteps[:, k] (broadcast over the
// chunk's tokens, never repeated in memory), written into `out` (tokens' sizes: the sequence's
// slice they take).
void ModulateChunksInto(const BackboneConfig& c, const TowerWeights& w, const torch::Tensor& tokens,
                        const torch::Tensor& timesteps, int64_t chunk_tokens,
                        const torch::Tensor& out) {
  auto [shift, scale] = TimeModulation(c, w, timesteps);  // [B, K, dim]
  const std::vector<int64_t> chunks = {tokens.size(0), timesteps.size(1), chunk_tokens, -1};
  Modulate(tokens.reshape(chunks), shift.unsqueeze(2), scale.unsqueeze(2), ModulationDtype(c),
           out.view(chunks));
}

// A tower's sequence [B, n, dim] of `dtype`, handed out slice by slice in order: its parts are
// written into their places, not concatenated.
class Sequence {
 public:
  Sequence(int64_t b, int64_t n, int64_t dim, const torch::TensorOptions& options)
      : x_(torch::empty({b, n, dim}, options)) {}
  torch::Tensor Next(int64_t tokens) {
    torch::Tensor slice = x_.narrow(1, at_, tokens);
    at_ += tokens;
    return slice;
  }
  // The registers [r, dim], the same for every row.
  void Registers(const torch::Tensor& registers) {
    Next(registers.size(0)).copy_(registers.unsqueeze(0).expand({x_.size(0), -1, -1}));
  }
  // The whole sequence, once every slice has been written.
  torch::Tensor Done() && { return std::move(x_); }

 private:
  torch::Tensor x_;
  int64_t at_ = 0;
};

// residual + the attention of u_in (the block's normed x): the residual added by the output
// projection (Linear), no pass of its own on the CPU.
torch::Tensor Attention(const TowerContext& ctx, const BlockWeights& bw, const torch::Tensor& u_in,
                        const torch::Tensor& residual) {
  RECORD_FUNCTION("praxis::attention", std::vector<c10::IValue>());
  const BackboneConfig& c = ctx.config;
  const int64_t b = u_in.size(0), t = u_in.size(1), hd = c.head_dim();
  const int64_t h = c.num_heads, kvh = c.num_kv_heads;
  // On the CPU the projection runs without its bias (zero but for the gate's): addmm's broadcast
  // of it into the output took 1.4 ms of a bench small B8 bf16 step's profile on an AMX Xeon
  // (stop 32), and the gate takes its bias where it is applied.
  const bool on_cpu = !u_in.is_cuda();
  const auto qkvg = Linear(u_in, bw.qkvg_w, on_cpu ? torch::Tensor() : bw.qkvg_b)
                        .split({h * hd, kvh * hd, kvh * hd, h}, -1);
  // [B, heads, T, hd] after the qk norm and the rotary embedding.
  auto heads = [&](const torch::Tensor& x, const torch::Tensor& norm) {
    if (on_cpu) return cpu::NormRopeHeads(x, norm, c.norm_eps, ctx.rope.cos, ctx.rope.sin);
    return ApplyRope(norm.defined() ? RmsNormWith(x, norm, c.norm_eps) : x, ctx.rope)
        .transpose(1, 2);
  };
  torch::Tensor q = heads(qkvg[0].view({b, t, h, hd}), bw.q_norm);
  torch::Tensor k = heads(qkvg[1].view({b, t, kvh, hd}), bw.k_norm);
  torch::Tensor v = qkvg[2].view({b, t, kvh, hd}).transpose(1, 2);
  if (ctx.mode == AttentionMode::kDense || !on_cpu) {
    // These kernels want a k/v head per query head; the sparse CPU path shares them (GQA).
    k = ExpandKvHeads(k, h);
    v = ExpandKvHeads(v, h);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  const bool sparse = ctx.mode == AttentionMode::kSparse;
  torch::Tensor o;  // gated, [B, T, H·hd]
  {
    RECORD_FUNCTION("praxis::attention_core", std::vector<c10::IValue>());
    if (on_cpu) {
      // Gated as TileAttention stores it where it runs: one pass less over the heads.
      o = sparse
              ? GatedSparseAttention(q, k, v, ctx.mask.plan, scale, qkvg[3], bw.gate_b)
              : cpu::GateHeads(DenseAttention(q, k, v, ctx.mask.dense, scale), qkvg[3], bw.gate_b);
    } else {
      o = sparse ? SparseAttention(q, k, v, ctx.mask.plan, scale)
                 : DenseAttention(q, k, v, ctx.mask.dense, scale);
      o = (o.transpose(1, 2) * torch::sigmoid(qkvg[3]).unsqueeze(-1)).reshape({b, t, h * hd});
    }
  }
  return Linear(o, bw.out_w, bw.out_b, residual);
}

torch::Tensor Block(const TowerContext& ctx, const BlockWeights& bw, torch::Tensor x) {
  const BackboneConfig& c = ctx.config;
  x = Attention(ctx, bw, RmsNormWith(x, bw.norm1, c.norm_eps), x);
  const torch::Tensor u = RmsNormWith(x, bw.norm2, c.norm_eps);
  RECORD_FUNCTION(bw.moe ? "praxis::moe" : "praxis::ffn", std::vector<c10::IValue>());
  if (bw.moe) return Moe(u, bw.moe_w, c.moe.top_k, c.routed_scale, MoeDispatch::kAuto, x);
  return SwiGlu(u, bw.ffn_a, bw.ffn_b, bw.ffn_down, x);
}

}  // namespace

torch::Tensor TextIn(const BackboneConfig& c, const EncoderWeights& w, const torch::Tensor& text) {
  torch::Tensor x = Linear(text, w.text_fc1_w, w.text_fc1_b);
  x = torch::gelu(x, c.gelu_approximate == "tanh" ? "tanh" : "none");
  return RmsNorm(Linear(x, w.text_fc2_w, w.text_fc2_b), w.text_norm, c.norm_eps);
}

EncoderResult RunEncoder(const EncoderWeights& w, const TowerContext& ctx,
                         const torch::Tensor& text_tokens, const torch::Tensor& anchor,
                         const torch::Tensor& clean, const torch::Tensor& noised,
                         const torch::Tensor& timesteps, int64_t frames_per_chunk) {
  const BackboneConfig& c = ctx.config;
  const TowerWeights& tw = w.tower;
  const torch::ScalarType dt = tw.registers.scalar_type();
  const int64_t b = noised.size(0), kf = noised.size(2), h = noised.size(3), wd = noised.size(4);
  auto video_in = [&](const torch::Tensor& x) {
    return Linear(VideoTokens(x), tw.video_in_w, tw.video_in_b);
  };
  const torch::Tensor anchor_tokens = video_in(anchor), noised_tokens = video_in(noised);
  const torch::Tensor clean_tokens = clean.defined() ? video_in(clean) : torch::Tensor();
  Sequence seq(b,
               c.num_registers + anchor_tokens.size(1) + text_tokens.size(1) +
                   noised_tokens.size(1) + (clean.defined() ? clean_tokens.size(1) : 0),
               c.dim, noised_tokens.options().dtype(dt));
  seq.Registers(tw.registers);
  seq.Next(anchor_tokens.size(1)).copy_(anchor_tokens);
  seq.Next(text_tokens.size(1)).copy_(text_tokens);
  ModulateChunksInto(c, tw, noised_tokens, timesteps, frames_per_chunk * h * wd,
                     seq.Next(noised_tokens.size(1)));
  if (clean.defined()) {
    auto [shift, scale] = TimeModulation(
        c, tw, torch::full({b, 1}, c.clean_timestep, timesteps.options().dtype(torch::kFloat32)));
    Modulate(clean_tokens, shift, scale, ModulationDtype(c), seq.Next(clean_tokens.size(1)));
  }
  EncoderResult out;
  torch::Tensor x = std::move(seq).Done();
  out.embeddings = x;
  const auto& taps = c.encoder.tap_blocks;
  std::vector<torch::Tensor> by_block(tw.blocks.size());
  for (size_t i = 0; i < tw.blocks.size(); ++i) {
    x = Block(ctx, tw.blocks[i], x);
    by_block[i] = x;
  }
  for (int64_t i : taps) out.taps.push_back(by_block[i]);
  const int64_t noised_start =
      c.num_registers + anchor.size(3) * anchor.size(4) + text_tokens.size(1);
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
  const torch::Tensor u = UnpatchTokens(noised, ph, pw);
  const torch::Tensor tokens = Linear(u, tw.video_in_w, tw.video_in_b);
  const int64_t n = kf * hh * ww;
  const torch::TensorOptions options = tokens.options().dtype(tw.registers.scalar_type());
  Sequence seq(b, r + n, c.dim, options);
  seq.Registers(tw.registers);
  ModulateChunksInto(c, tw, tokens, timesteps, frames_per_chunk * hh * ww, seq.Next(n));
  torch::Tensor x = std::move(seq).Done();
  const std::vector<int64_t> fine = {b, kf, hh / ph, ph, ww / pw, pw, c.dim};
  for (const BlockWeights& bw : tw.blocks) {
    // The per-token modulation runs on the coarse grid and is broadcast over each ph x pw patch
    // of the fine grid: token (f, row·ph + i, col·pw + j) reads (f, row, col).
    const auto [shift, scale] = ShiftAndScale(c, Linear(cond, bw.mod_w, bw.mod_b));
    auto patches = [](const torch::Tensor& m) { return m.unsqueeze(3).unsqueeze(5); };
    Sequence modulated(b, r + n, c.dim, options);
    modulated.Next(r).copy_(x.narrow(1, 0, r));
    Modulate(x.narrow(1, r, n).view(fine), patches(shift), patches(scale), mdt,
             modulated.Next(n).view(fine));
    x = Block(ctx, bw, std::move(modulated).Done());
  }
  torch::Tensor y = Linear(RmsNorm(x.narrow(1, r, n), w.norm, c.norm_eps), w.out_w, w.out_b);
  y = y.reshape({b, kf, hh, ww, -1}).permute({0, 4, 1, 2, 3});
  return Patchify(y, ph, pw);
}

}  // namespace praxis::model
