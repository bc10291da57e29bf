#include "model/backbone.h"

#include <c10/core/InferenceMode.h>

#include <exception>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/cpu_kernels.h"
#include "model/cpu_runtime.h"
#include "model/layers.h"
#include "model/towers.h"
#include "model/weight_binding.h"
#include "wire/layout_key.h"

namespace praxis::model {
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

// The spans and counts of the encoder sequence [registers | anchor | text | noised | clean].
void SetSpans(const WindowLayout& l, EncoderFeatures& ft) {
  const int64_t r = l.registers, la = l.anchor_h * l.anchor_w, lt = l.text_len;
  const int64_t noised = l.k * l.f * l.h * l.w;
  ft.register_span = {0, r};
  ft.anchor_span = {r, la};
  ft.text_span = {r + la, lt};
  ft.noised_span = {r + la + lt, noised};
  if (l.k > 1) ft.clean_span = Span{r + la + lt + noised, (l.k - 1) * l.f * l.h * l.w};
  ft.frames_per_chunk = l.f;
  ft.tokens_per_frame = l.h * l.w;
  ft.n_chunks = l.k;
}

}  // namespace

VideoBackbone::VideoBackbone(BackboneConfig config, BackboneOptions options,
                             std::unique_ptr<BackboneWeights> w,
                             std::optional<cpu::Float32WeightHold> float32_hold)
    : config_(std::move(config)),
      options_(options),
      float32_hold_(std::move(float32_hold)),
      w_(std::move(w)),
      mask_cache_(options.mask_cache_entries, options.mask_cache_bytes),
      plans_("a layout plan", options.mask_cache_entries, options.mask_cache_bytes) {
  if (options.device.is_cpu() && options.text_cache_entries > 0) {
    texts_ = std::make_unique<TextCache>(options.text_cache_entries, options.text_cache_bytes);
  }
}

VideoBackbone::~VideoBackbone() = default;

torch::ScalarType VideoBackbone::dtype() const { return config_.param_dtype(); }

torch::ScalarType VideoBackbone::compute_dtype() const {
  return w_->enc.tower.registers.scalar_type();
}

namespace {

// Calls f on every Linear weight [N, K] of w that the CPU runs through Linear (model/layers.h):
// the projections, not the dense SwiGLU layers' weights (their pieces read them).
void ForEachLinear(BackboneWeights& w, const std::function<void(torch::Tensor&)>& f) {
  for (torch::Tensor* t : {&w.enc.text_fc1_w, &w.enc.text_fc2_w, &w.enc.enc_out_w, &w.dec.out_w}) {
    f(*t);
  }
  for (TowerWeights* tower : {&w.enc.tower, &w.dec.tower}) {
    f(tower->t_proj_w);
    f(tower->video_in_w);
    for (BlockWeights& b : tower->blocks) {
      f(b.qkvg_w);
      f(b.out_w);
      if (b.mod_w.defined()) f(b.mod_w);
    }
  }
}

// A float32 CPU model's Linear weights [N, K], and its dense SwiGLU layers', laid out as their
// transposes' rows (the same tensors, column-major), in place of the originals, not beside them:
// oneDNN's float32 brgemm, which runs its Linears (cpu::BrgemmLinear) and dense SwiGLU pieces
// (cpu::SwiGluPieceInto), reads no transposed weight. LibTorch's linear reads either layout.
void LayOutLinearsForBrgemm(BackboneWeights& w) {
  const auto lay_out = [](torch::Tensor& t) { t = t.t().contiguous().t(); };
  ForEachLinear(w, lay_out);
  for (TowerWeights* tower : {&w.enc.tower, &w.dec.tower}) {
    for (BlockWeights& b : tower->blocks) {
      if (!b.moe) {
        for (torch::Tensor* t : {&b.ffn_a, &b.ffn_b, &b.ffn_down}) lay_out(*t);
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<VideoBackbone>> VideoBackbone::Create(
    const BackboneConfig& config, const TensorMap& weights, const BackboneOptions& options) {
  try {
    // On a CPU whose GEMM in the 16-bit parameter dtype is emulated or the slower one, the model
    // is computed in float32 end to end, within the float32 weight budget: every op then runs its
    // float32 path, with no conversion of activations between ops (what MatmulViaFloat32 alone
    // left: 7-9 % of a bench small bf16 step on a Xeon without AMX), and more exactly.
    const torch::ScalarType dt = config.param_dtype();
    const bool reduced_on_cpu =
        options.device.is_cpu() && (dt == torch::kBFloat16 || dt == torch::kFloat16);
    // The CPU's GEMMs in this dtype are timed once per process (~30 ms), here rather than in a
    // first forward: its matmuls' choice reads them (GemmInFloat32).
    const bool gemm_in_float32 = reduced_on_cpu && ReducedGemmInFloat32(dt);
    std::optional<cpu::Float32WeightHold> hold;
    TensorMap converted;
    if (reduced_on_cpu && options.cpu_float32_compute.value_or(gemm_in_float32)) {
      int64_t bytes = 0;
      for (const auto& [name, t] : weights) {
        if (t.scalar_type() == dt) bytes += t.numel() * int64_t{sizeof(float)};
      }
      hold = cpu::HoldFloat32WeightBytes(bytes);
      if (hold.has_value()) {
        converted = weights;
        for (auto& [name, t] : converted) {
          if (t.scalar_type() == dt) t = t.to(torch::kFloat32);
        }
      }
    }
    PRAXIS_ASSIGN_OR_RETURN(
        std::unique_ptr<BackboneWeights> w,
        BindWeights(config, hold.has_value() ? converted : weights, options.device));
    // A bf16 model's SwiGLU pieces run on oneDNN's brgemm (cpu::ExpertPieceInto) over packed
    // copies of their weights, made here for all of them or none (within the float32 weight
    // budget): a first forward's threads would pack them in the order they reach them.
    if (reduced_on_cpu && dt == torch::kBFloat16 && !hold.has_value() && !gemm_in_float32) {
      std::vector<cpu::BrgemmWeight> swiglu;
      for (const TowerWeights* tower : {&w->enc.tower, &w->dec.tower}) {
        for (const BlockWeights& b : tower->blocks) {
          if (b.moe) {
            for (const torch::Tensor& t :
                 {b.moe_w.gate_up, b.moe_w.down, b.moe_w.shared_gate_up, b.moe_w.shared_down}) {
              swiglu.push_back({t});
            }
          } else {
            for (const torch::Tensor& t : {b.ffn_a, b.ffn_b, b.ffn_down})
              swiglu.push_back({t, true});
          }
        }
      }
      (void)cpu::PackForBrgemm(swiglu);
      // Its Linears too (cpu::BrgemmLinear), each on its own: one with an odd K (which the VNNI
      // layout cannot take) or over the budget stays on LibTorch's.
      ForEachLinear(*w, [](torch::Tensor& t) { (void)cpu::PackForBrgemm({{t, true}}); });
    } else if (options.device.is_cpu() && w->enc.tower.registers.scalar_type() == torch::kFloat32 &&
               cpu::HasFloat32Brgemm()) {
      LayOutLinearsForBrgemm(*w);
    }
    return std::unique_ptr<VideoBackbone>(
        new VideoBackbone(config, options, std::move(w), std::move(hold)));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("placing weights on ", options.device.str(), " failed: ", e.what()));
  }
}

absl::StatusOr<BackboneOutput> VideoBackbone::Forward(const StepInputs& inputs) {
  absl::Status valid;
  try {
    valid = ValidateStep(config_, inputs);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("forward failed: ", e.what()));
  }
  PRAXIS_RETURN_IF_ERROR(valid);
  return ForwardValidated(inputs);
}

absl::StatusOr<BackboneOutput> VideoBackbone::ForwardValidated(const StepInputs& inputs) {
  PRAXIS_ASSIGN_OR_RETURN(const std::shared_ptr<const LayoutPlan> plan, PlanLayout(inputs));
  return ForwardPlanned(inputs, *plan);
}

absl::StatusOr<BackboneOutput> VideoBackbone::ForwardPlanned(const StepInputs& inputs,
                                                             const LayoutPlan& plan) const {
  PRAXIS_ASSIGN_OR_RETURN(const StepInputs in, OnDevice(inputs));
  try {
    return RunPlanned(in, plan);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("forward failed: ", e.what()));
  }
}

absl::StatusOr<StepInputs> VideoBackbone::OnDevice(const StepInputs& inputs) const {
  const torch::Device dev = options_.device;
  StepInputs in = inputs;
  try {
    for (const wire::InputField& field : wire::kInputFields) {
      torch::Tensor& t = in.*field.tensor;
      if (!t.defined() || t.device() == dev) continue;
      // Host to GPU through pinned memory, so the copy is asynchronous on the current stream.
      t = dev.is_cuda() && t.is_cpu() ? t.pin_memory().to(dev, /*non_blocking=*/true) : t.to(dev);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("staging inputs on ", dev.str(), ": ", e.what()));
  }
  return in;
}

absl::StatusOr<std::shared_ptr<const TowerMask>> VideoBackbone::Mask(const MaskKey& key) {
  return mask_cache_.Get(key, [&]() -> absl::StatusOr<TowerMask> {
    PRAXIS_ASSIGN_OR_RETURN(TokenTags tags, WindowTags(key.slots, key.chunk_size));
    const MaskRule rule = ChunkCausalRule(tags);
    PRAXIS_ASSIGN_OR_RETURN(BlockMask block, BuildBlockMask(rule, tags, tags, key.block_size));
    TowerMask m{std::move(block), {}, {}};
    if (options_.attention == AttentionMode::kSparse) {
      m.plan = BuildAttentionPlan(m.block, rule, tags, tags, options_.device, compute_dtype(),
                                  config_.head_dim());
    } else {
      m.dense = DenseMask(rule, tags.length(), tags.length()).to(options_.device);
    }
    return m;
  });
}

absl::StatusOr<std::shared_ptr<const LayoutPlan>> VideoBackbone::PlanLayout(const StepInputs& in) {
  return plans_.Get(wire::LayoutKey(in), [&] { return BuildPlan(in); });
}

absl::StatusOr<LayoutPlan> VideoBackbone::BuildPlan(const StepInputs& in) {
  const BackboneConfig& c = config_;
  const torch::Device dev = options_.device;
  LayoutPlan plan;
  plan.layout = WindowOf(wire::GeometryOf(in), c.num_registers);
  PRAXIS_ASSIGN_OR_RETURN(plan.enc_mask, Mask(EncoderMaskKey(plan.layout, c.flex_block_size)));
  if (in.decode) {
    PRAXIS_ASSIGN_OR_RETURN(plan.dec_mask,
                            Mask(DecoderMaskKey(plan.layout, c.ph(), c.pw(), c.flex_block_size)));
  }
  try {
    plan.positions = EncoderPositions(c, in);
    plan.enc_rope = MakeRopeTables(plan.positions, c.head_dim(), c.rope_theta, dev);
    if (in.decode) {
      plan.dec_rope = MakeRopeTables(DecoderPositions(c, in), c.head_dim(), c.rope_theta, dev);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("planning the layout failed: ", e.what()));
  }
  return plan;
}

BackboneOutput VideoBackbone::RunPlanned(const StepInputs& in, const LayoutPlan& plan) const {
  // Inference mode, not just no grad: LibTorch's ops skip the autograd and view-tracking
  // dispatch, a fixed cost on each of the ~330 ops of a step.
  c10::InferenceMode inference;
  const BackboneConfig& c = config_;
  const int64_t f = in.frames_per_chunk;
  const TowerContext enc{c, *plan.enc_mask, plan.enc_rope, options_.attention};
  auto text_in = [&](const torch::Tensor& text) { return TextIn(c, w_->enc, text); };
  const torch::Tensor text = texts_ ? texts_->Tokens(in.text, text_in) : text_in(in.text);
  EncoderResult er =
      RunEncoder(w_->enc, enc, text, in.anchor, in.clean, in.noised, in.timesteps, f);
  BackboneOutput out;
  if (plan.dec_mask != nullptr) {
    const TowerContext dec{c, *plan.dec_mask, plan.dec_rope, options_.attention};
    out.velocity = RunDecoder(w_->dec, dec, in.noised, er.cond, in.timesteps, f);
  }
  out.cond = er.cond;
  out.features.taps = std::move(er.taps);
  out.features.embeddings = er.embeddings;
  out.features.positions = plan.positions.unsqueeze(0).expand({in.noised.size(0), -1}).contiguous();
  SetSpans(plan.layout, out.features);
  return out;
}

int64_t LayoutPlan::nbytes() const {
  int64_t n = positions.defined() ? positions.nbytes() : 0;
  for (const auto* m : {enc_mask.get(), dec_mask.get()}) {
    if (m != nullptr) n += m->nbytes();
  }
  for (const RopeTables* r : {&enc_rope, &dec_rope}) {
    if (r->cos.defined()) n += r->cos.nbytes() + r->sin.nbytes();
  }
  return n;
}

}  // namespace praxis::model
