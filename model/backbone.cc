#include "model/backbone.h"

#include <cmath>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/layers.h"
#include "model/towers.h"

namespace praxis::model {
namespace {

std::string ShapeString(const torch::Tensor& t) {
  return t.defined() ? absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]") : "absent";
}

// Looks weights up by name under one prefix, remembering the first missing one.
class WeightReader {
 public:
  WeightReader(const TensorMap& map, torch::Device device) : map_(map), device_(device) {}
  torch::Tensor operator()(const std::string& name) {
    auto it = map_.find(name);
    if (it == map_.end()) {
      if (missing_.empty()) missing_ = name;
      return {};
    }
    return it->second.to(device_);
  }
  absl::Status status() const {
    return missing_.empty()
               ? absl::OkStatus()
               : absl::InvalidArgumentError(absl::StrCat("missing weight '", missing_, "'"));
  }

 private:
  const TensorMap& map_;
  torch::Device device_;
  std::string missing_;
};

// NormWeight of a weight that may be missing (the reader reports it).
torch::Tensor NormWeightOf(const torch::Tensor& weight, double scale) {
  return weight.defined() ? NormWeight(weight, scale) : weight;
}

TowerWeights ReadTower(WeightReader& get, const BackboneConfig& c, const TowerConfig& t,
                       const std::string& p, bool modulation) {
  TowerWeights w{get(p + "registers"),
                 get(p + "t_embedding.freqs"),
                 get(p + "t_embedding.phases"),
                 get(p + "t_proj.VideoTensor.weight"),
                 get(p + "t_proj.VideoTensor.bias"),
                 get(p + "input_projections.VideoTensor.proj.weight"),
                 get(p + "input_projections.VideoTensor.proj.bias"),
                 {}};
  for (int64_t i = 0; i < t.depth; ++i) {
    const std::string b = absl::StrCat(p, "blocks.", i, ".");
    BlockWeights bw;
    bw.scale = 1.0 / std::sqrt(static_cast<double>(i + 1));
    bw.norm1 = NormWeightOf(get(b + "norm1.weight"), bw.scale);
    bw.norm2 = NormWeightOf(get(b + "norm2.weight"), bw.scale);
    if (c.qk_norm) {
      bw.q_norm = NormWeightOf(get(b + "mha.q_norm.weight"), 1.0);
      bw.k_norm = NormWeightOf(get(b + "mha.k_norm.weight"), 1.0);
    }
    // q, k, v and the gate read the same input: one matmul over their stacked rows.
    const torch::Tensor q = get(b + "mha.in_proj.q_weight"), k = get(b + "mha.in_proj.k_weight"),
                        v = get(b + "mha.in_proj.v_weight"), gate_w = get(b + "mha.gate.weight"),
                        gate_b = get(b + "mha.gate.bias");
    if (q.defined() && k.defined() && v.defined() && gate_w.defined() && gate_b.defined()) {
      bw.qkvg_w = torch::cat({q, k, v, gate_w}, 0);
      bw.qkvg_b = torch::cat({torch::zeros({q.size(0) + k.size(0) + v.size(0)}, gate_b.options()),
                              gate_b});
    }
    bw.out_w = get(b + "mha.out_proj.weight");
    bw.out_b = get(b + "mha.out_proj.bias");
    bw.moe = t.is_moe(i);
    if (bw.moe) {
      bw.moe_w = {get(b + "ffn.router.weight"),         get(b + "ffn.expert_bias"),
                  get(b + "ffn.routed.gate_up_weight"), get(b + "ffn.routed.down_weight"),
                  get(b + "ffn.shared.gate_up"),        get(b + "ffn.shared.down")};
    } else {
      bw.ffn_a = get(b + "ffn.0.linear.a_weight");
      bw.ffn_b = get(b + "ffn.0.linear.b_weight");
      bw.ffn_down = get(b + "ffn.1.weight");
    }
    if (modulation) {
      bw.mod_w = get(b + "modulation.weight");
      bw.mod_b = get(b + "modulation.bias");
    }
    w.blocks.push_back(std::move(bw));
  }
  return w;
}

}  // namespace

namespace {

torch::Tensor EncoderPositions(const BackboneConfig& c, const StepInputs& in) {
  const int64_t kf = in.noised.size(2), h = in.noised.size(3), w = in.noised.size(4);
  const int64_t clean_tokens = in.clean.defined() ? in.clean.size(2) * h * w : 0;
  const torch::Tensor noised = VideoPositions(kf, h, w, 2 * kFrameStride) + in.rope_shifts[2];
  return torch::cat({torch::zeros({c.num_registers}, torch::kInt64),
                     VideoPositions(1, in.anchor.size(3), in.anchor.size(4), 0) + in.rope_shifts[0],
                     kFrameStride + c.text_position_offset +
                         torch::arange(in.text.size(1), torch::kInt64) + in.rope_shifts[1],
                     noised, noised.narrow(0, 0, clean_tokens)});
}

torch::Tensor DecoderPositions(const BackboneConfig& c, const StepInputs& in) {
  return torch::cat(
      {torch::zeros({c.num_registers}, torch::kInt64),
       VideoPositions(in.noised.size(2), in.noised.size(3) * c.ph(), in.noised.size(4) * c.pw(),
                      c.decoder_frame_block_offset * kFrameStride) +
           in.rope_shifts[3]});
}

absl::Status Check(bool ok, absl::string_view field, absl::string_view expected,
                   const std::string& got) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", expected, ", got ", got));
}

bool IsFloat(const torch::Tensor& t) {
  const auto s = t.scalar_type();
  return s == torch::kFloat32 || s == torch::kBFloat16 || s == torch::kFloat16;
}

absl::Status CheckVideo(const torch::Tensor& t, absl::string_view field, int64_t b, int64_t c,
                        int64_t frames, int64_t h, int64_t w) {
  const std::string want =
      absl::StrCat("a float tensor of shape [", b, ", ", c, ", ", frames, ", ", h, ", ", w, "]");
  const bool ok = t.defined() && IsFloat(t) && t.dim() == 5 && t.size(0) == b && t.size(1) == c &&
                  t.size(2) == frames && t.size(3) == h && t.size(4) == w;
  return Check(ok, field, want, ShapeString(t));
}

absl::Status CheckFinite(const torch::Tensor& t, absl::string_view field) {
  if (!t.defined() || torch::isfinite(t).all().item<bool>()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected finite values, got NaN or inf"));
}

}  // namespace

absl::Status ValidateStep(const BackboneConfig& c, const StepInputs& in) {
  const torch::Tensor& n = in.noised;
  PRAXIS_RETURN_IF_ERROR(Check(
      n.defined() && IsFloat(n) && n.dim() == 5 && n.size(0) >= 1 &&
          n.size(1) == c.latent_channels() && n.size(2) >= 1 && n.size(3) >= 1 && n.size(4) >= 1,
      "noised", absl::StrCat("a float tensor [B, ", c.latent_channels(), ", K*F, h, w]"),
      ShapeString(n)));
  const int64_t b = n.size(0), kf = n.size(2), h = n.size(3), w = n.size(4);
  const int64_t f = in.frames_per_chunk;
  PRAXIS_RETURN_IF_ERROR(Check(f >= 1 && kf % f == 0, "frames_per_chunk",
                               absl::StrCat("a divisor of the noised frames (", kf, ")"),
                               absl::StrCat(f)));
  const int64_t k = kf / f;
  PRAXIS_RETURN_IF_ERROR(Check(h <= kRowStride - 1 && w <= kRowStride, "noised",
                               "a grid of at most 359 x 360", absl::StrCat(h, " x ", w)));
  PRAXIS_RETURN_IF_ERROR(
      Check(h * c.ph() <= kRowStride - 1 && w * c.pw() <= kRowStride, "noised",
            absl::StrCat("a decoder grid (h*", c.ph(), ", w*", c.pw(), ") of at most 359 x 360"),
            absl::StrCat(h * c.ph(), " x ", w * c.pw())));
  const torch::Tensor& ts = in.timesteps;
  PRAXIS_RETURN_IF_ERROR(
      Check(ts.defined() && IsFloat(ts) && ts.dim() == 2 && ts.size(0) == b && ts.size(1) == k,
            "timesteps", absl::StrCat("a float tensor [", b, ", ", k, "]"), ShapeString(ts)));
  PRAXIS_RETURN_IF_ERROR(CheckFinite(ts, "timesteps"));
  PRAXIS_RETURN_IF_ERROR(Check(((ts >= 0) & (ts <= 1)).all().item<bool>(), "timesteps",
                               "values in [0, 1]", "a value outside"));
  const torch::Tensor& text = in.text;
  PRAXIS_RETURN_IF_ERROR(
      Check(text.defined() && IsFloat(text) && text.dim() == 3 && text.size(0) == b &&
                text.size(1) >= 1 && text.size(1) <= kFrameStride - 1 - c.text_position_offset &&
                text.size(2) == c.text_dim,
            "text",
            absl::StrCat("a float tensor [", b, ", L, ", c.text_dim,
                         "] with 1 <= L <= ", kFrameStride - 1 - c.text_position_offset),
            ShapeString(text)));
  const torch::Tensor& a = in.anchor;
  const bool anchor_ok = a.defined() && a.dim() == 5 && a.size(3) >= 1 &&
                         a.size(3) <= kRowStride - 1 && a.size(4) >= 1 && a.size(4) <= kRowStride;
  PRAXIS_RETURN_IF_ERROR(
      Check(anchor_ok, "anchor",
            absl::StrCat("a float tensor [", b, ", ", c.latent_channels(), ", 1, ah, aw]"),
            ShapeString(a)));
  PRAXIS_RETURN_IF_ERROR(CheckVideo(a, "anchor", b, c.latent_channels(), 1, a.size(3), a.size(4)));
  if (k == 1) {
    PRAXIS_RETURN_IF_ERROR(
        Check(!in.clean.defined(), "clean", "absent for K == 1", ShapeString(in.clean)));
  } else {
    PRAXIS_RETURN_IF_ERROR(
        CheckVideo(in.clean, "clean", b, c.latent_channels(), (k - 1) * f, h, w));
  }
  for (size_t i = 0; i < in.rope_shifts.size(); ++i) {
    PRAXIS_RETURN_IF_ERROR(Check(in.rope_shifts[i] >= 0 && in.rope_shifts[i] < kFrameStride,
                                 absl::StrCat("rope_shifts[", i, "]"), "a value in [0, 129600)",
                                 absl::StrCat(in.rope_shifts[i])));
  }
  for (const auto& [t, name] :
       {std::pair{&text, "text"}, {&a, "anchor"}, {&in.clean, "clean"}, {&n, "noised"}}) {
    PRAXIS_RETURN_IF_ERROR(CheckFinite(*t, name));
  }
  return absl::OkStatus();
}

VideoBackbone::VideoBackbone(BackboneConfig config, BackboneOptions options,
                             std::unique_ptr<BackboneWeights> w)
    : config_(std::move(config)),
      options_(options),
      w_(std::move(w)),
      mask_cache_(options.mask_cache_entries, options.mask_cache_bytes) {}

VideoBackbone::~VideoBackbone() = default;

torch::ScalarType VideoBackbone::dtype() const { return w_->enc.tower.registers.scalar_type(); }

absl::StatusOr<std::unique_ptr<VideoBackbone>> VideoBackbone::Create(
    const BackboneConfig& config, const TensorMap& weights, const BackboneOptions& options) {
  try {
    WeightReader get(weights, options.device);
    auto w = std::make_unique<BackboneWeights>();
    w->enc.tower = ReadTower(get, config, config.encoder, "backbone.encoder.", false);
    w->dec.tower = ReadTower(get, config, config.decoder, "backbone.decoder.", true);
    const std::string t = "backbone.encoder.input_projections.TextEncodingTensor.proj.";
    w->enc.text_fc1_w = get(t + "0.weight");
    w->enc.text_fc1_b = get(t + "0.bias");
    w->enc.text_fc2_w = get(t + "2.weight");
    w->enc.text_fc2_b = get(t + "2.bias");
    w->enc.text_norm = get(t + "3.weight");
    w->enc.enc_out_w = get("backbone.encoder.output_projections.VideoTensor.proj.weight");
    w->enc.enc_out_b = get("backbone.encoder.output_projections.VideoTensor.proj.bias");
    const std::string d = "backbone.decoder.output_projections.VideoTensor.proj.";
    w->dec.norm = get(d + "0.weight");
    w->dec.out_w = get(d + "1.weight");
    w->dec.out_b = get(d + "1.bias");
    PRAXIS_RETURN_IF_ERROR(get.status());
    return std::unique_ptr<VideoBackbone>(new VideoBackbone(config, options, std::move(w)));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("placing weights on ", options.device.str(), " failed: ", e.what()));
  }
}

absl::StatusOr<BackboneOutput> VideoBackbone::Forward(const StepInputs& inputs) {
  try {
    PRAXIS_RETURN_IF_ERROR(ValidateStep(config_, inputs));
    torch::NoGradGuard no_grad;
    return ForwardValid(inputs);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("forward failed: ", e.what()));
  }
}

absl::StatusOr<std::shared_ptr<const TowerMask>> VideoBackbone::Mask(const MaskKey& key) {
  return mask_cache_.Get(key, [&]() -> absl::StatusOr<TowerMask> {
    PRAXIS_ASSIGN_OR_RETURN(TokenTags tags, WindowTags(key.slots, key.chunk_size));
    const MaskRule rule = ChunkCausalRule(tags);
    PRAXIS_ASSIGN_OR_RETURN(BlockMask block, BuildBlockMask(rule, tags, tags, key.block_size));
    TowerMask m{std::move(block), {}, {}};
    if (options_.attention == AttentionMode::kSparse) {
      m.plan = BuildAttentionPlan(m.block, rule, options_.device, dtype());
    } else {
      m.dense = DenseMask(rule, tags.length(), tags.length()).to(options_.device);
    }
    return m;
  });
}

absl::StatusOr<BackboneOutput> VideoBackbone::ForwardValid(const StepInputs& raw) {
  const BackboneConfig& c = config_;
  const torch::Device dev = options_.device;
  auto on_device = [&](const torch::Tensor& t) { return t.defined() ? t.to(dev) : t; };
  StepInputs in = raw;
  for (torch::Tensor* t : {&in.text, &in.anchor, &in.clean, &in.noised, &in.timesteps}) {
    *t = on_device(*t);
  }
  const int64_t b = in.noised.size(0), kf = in.noised.size(2), h = in.noised.size(3),
                w = in.noised.size(4), f = in.frames_per_chunk, k = kf / f;
  const WindowLayout layout{.registers = c.num_registers,
                            .anchor_h = in.anchor.size(3),
                            .anchor_w = in.anchor.size(4),
                            .text_len = in.text.size(1),
                            .k = k,
                            .f = f,
                            .h = h,
                            .w = w};
  PRAXIS_ASSIGN_OR_RETURN(auto enc_mask, Mask(EncoderMaskKey(layout, c.flex_block_size)));
  const torch::Tensor positions = EncoderPositions(c, in);
  const TowerContext enc{c, *enc_mask, MakeRopeTables(positions, c.head_dim(), c.rope_theta, dev),
                         options_.attention};
  EncoderResult er =
      RunEncoder(w_->enc, enc, in.text, in.anchor, in.clean, in.noised, in.timesteps, f);
  BackboneOutput out;
  if (in.decode) {
    PRAXIS_ASSIGN_OR_RETURN(auto dec_mask,
                            Mask(DecoderMaskKey(layout, c.ph(), c.pw(), c.flex_block_size)));
    const TowerContext dec{c, *dec_mask,
                           MakeRopeTables(DecoderPositions(c, in), c.head_dim(), c.rope_theta, dev),
                           options_.attention};
    out.velocity = RunDecoder(w_->dec, dec, in.noised, er.cond, in.timesteps, f);
  }
  out.cond = er.cond;
  EncoderFeatures& ft = out.features;
  ft.taps = std::move(er.taps);
  ft.embeddings = er.embeddings;
  ft.positions = positions.to(dev).unsqueeze(0).expand({b, -1}).contiguous();
  const int64_t r = c.num_registers, la = layout.anchor_h * layout.anchor_w, lt = layout.text_len;
  ft.register_span = {0, r};
  ft.anchor_span = {r, la};
  ft.text_span = {r + la, lt};
  ft.noised_span = {r + la + lt, kf * h * w};
  if (k > 1) ft.clean_span = Span{r + la + lt + kf * h * w, (k - 1) * f * h * w};
  ft.frames_per_chunk = f;
  ft.tokens_per_frame = h * w;
  ft.n_chunks = k;
  return out;
}

}  // namespace praxis::model
