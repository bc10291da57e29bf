#include "model/step_validation.h"

#include <ATen/Dispatch.h>

#include <cmath>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "model/cpu_kernels.h"
#include "model/layers.h"

namespace praxis::model {
namespace {

std::string ShapeString(const torch::Tensor& t) {
  return t.defined() ? absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]") : "absent";
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

// max |t|: one pass over the values on the CPU (where requests are decoded), ATen's ops elsewhere;
// +inf if a value is infinite, else NaN if one is NaN (both propagate through max); 0 if empty.
double MaxAbsValue(const torch::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0;
  return t.is_cuda() ? t.abs().max().item<double>() : cpu::MaxAbs(t);
}

// Every value of `t` finite; its max |value| into *max_abs when given.
absl::Status CheckFinite(const torch::Tensor& t, absl::string_view field,
                         double* max_abs = nullptr) {
  const double m = MaxAbsValue(t);
  if (max_abs != nullptr) *max_abs = m;
  if (std::isfinite(m)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected finite values, got NaN or inf"));
}

// noised [B, C, K·F, h, w], F dividing K·F, and both towers' grids within the position strides.
absl::Status CheckNoised(const BackboneConfig& c, const StepInputs& in) {
  const torch::Tensor& n = in.noised;
  PRAXIS_RETURN_IF_ERROR(Check(
      n.defined() && IsFloat(n) && n.dim() == 5 && n.size(0) >= 1 &&
          n.size(1) == c.latent_channels() && n.size(2) >= 1 && n.size(3) >= 1 && n.size(4) >= 1,
      "noised", absl::StrCat("a float tensor [B, ", c.latent_channels(), ", K*F, h, w]"),
      ShapeString(n)));
  const int64_t kf = n.size(2), h = n.size(3), w = n.size(4);
  const int64_t f = in.frames_per_chunk;
  PRAXIS_RETURN_IF_ERROR(Check(f >= 1 && kf % f == 0, "frames_per_chunk",
                               absl::StrCat("a divisor of the noised frames (", kf, ")"),
                               absl::StrCat(f)));
  PRAXIS_RETURN_IF_ERROR(Check(h <= kRowStride - 1 && w <= kRowStride, "noised",
                               "a grid of at most 359 x 360", absl::StrCat(h, " x ", w)));
  return Check(h * c.ph() <= kRowStride - 1 && w * c.pw() <= kRowStride, "noised",
               absl::StrCat("a decoder grid (h*", c.ph(), ", w*", c.pw(), ") of at most 359 x 360"),
               absl::StrCat(h * c.ph(), " x ", w * c.pw()));
}

// Every value of the float tensor `t` within [lo, hi] (NaN is not): one pass on the CPU, where
// requests are decoded (five ATen ops cost more than a step's few timesteps); ATen's ops elsewhere.
bool AllWithin(const torch::Tensor& t, double lo, double hi) {
  if (t.is_cuda()) return ((t >= lo) & (t <= hi)).all().item<bool>();
  const torch::Tensor c = t.contiguous();
  bool ok = true;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, c.scalar_type(), "AllWithin", [&] {
    const scalar_t* p = c.const_data_ptr<scalar_t>();
    for (int64_t i = 0; i < c.numel(); ++i) {
      const double v = static_cast<double>(p[i]);
      ok = ok && v >= lo && v <= hi;
    }
  });
  return ok;
}

// timesteps [B, K], finite, in [0, 1].
absl::Status CheckTimesteps(const torch::Tensor& ts, int64_t b, int64_t k) {
  PRAXIS_RETURN_IF_ERROR(
      Check(ts.defined() && IsFloat(ts) && ts.dim() == 2 && ts.size(0) == b && ts.size(1) == k,
            "timesteps", absl::StrCat("a float tensor [", b, ", ", k, "]"), ShapeString(ts)));
  PRAXIS_RETURN_IF_ERROR(CheckFinite(ts, "timesteps"));
  return Check(AllWithin(ts, 0, 1), "timesteps", "values in [0, 1]", "a value outside");
}

// text [B, L, text_dim] with L within the text's position range.
absl::Status CheckText(const BackboneConfig& c, const torch::Tensor& text, int64_t b) {
  const int64_t max_len = kFrameStride - 1 - c.text_position_offset;
  return Check(
      text.defined() && IsFloat(text) && text.dim() == 3 && text.size(0) == b &&
          text.size(1) >= 1 && text.size(1) <= max_len && text.size(2) == c.text_dim,
      "text",
      absl::StrCat("a float tensor [", b, ", L, ", c.text_dim, "] with 1 <= L <= ", max_len),
      ShapeString(text));
}

// anchor [B, C, 1, ah, aw] within the row stride; clean [B, C, (K-1)·F, h, w], absent for K == 1.
absl::Status CheckAnchorAndClean(const BackboneConfig& c, const StepInputs& in, int64_t k) {
  const int64_t b = in.noised.size(0), f = in.frames_per_chunk;
  const torch::Tensor& a = in.anchor;
  const bool anchor_ok = a.defined() && a.dim() == 5 && a.size(3) >= 1 &&
                         a.size(3) <= kRowStride - 1 && a.size(4) >= 1 && a.size(4) <= kRowStride;
  PRAXIS_RETURN_IF_ERROR(
      Check(anchor_ok, "anchor",
            absl::StrCat("a float tensor [", b, ", ", c.latent_channels(), ", 1, ah, aw]"),
            ShapeString(a)));
  PRAXIS_RETURN_IF_ERROR(CheckVideo(a, "anchor", b, c.latent_channels(), 1, a.size(3), a.size(4)));
  if (k == 1) {
    return Check(!in.clean.defined(), "clean", "absent for K == 1", ShapeString(in.clean));
  }
  return CheckVideo(in.clean, "clean", b, c.latent_channels(), (k - 1) * f, in.noised.size(3),
                    in.noised.size(4));
}

}  // namespace

// The checks run in this order, so the first failure named is stable: noised (and the grid),
// timesteps, text, anchor, clean, rope shifts, then the finite-value passes.
absl::Status ValidateStep(const BackboneConfig& c, const StepInputs& in,
                          InputMagnitudes* magnitudes) {
  PRAXIS_RETURN_IF_ERROR(CheckNoised(c, in));
  const int64_t b = in.noised.size(0), k = in.noised.size(2) / in.frames_per_chunk;
  PRAXIS_RETURN_IF_ERROR(CheckTimesteps(in.timesteps, b, k));
  PRAXIS_RETURN_IF_ERROR(CheckText(c, in.text, b));
  PRAXIS_RETURN_IF_ERROR(CheckAnchorAndClean(c, in, k));
  for (size_t i = 0; i < in.rope_shifts.size(); ++i) {
    PRAXIS_RETURN_IF_ERROR(Check(in.rope_shifts[i] >= 0 && in.rope_shifts[i] < kFrameStride,
                                 absl::StrCat("rope_shifts[", i, "]"), "a value in [0, 129600)",
                                 absl::StrCat(in.rope_shifts[i])));
  }
  InputMagnitudes found;
  for (size_t i = 0; i < std::size(wire::kInputFields); ++i) {
    const wire::InputField& field = wire::kInputFields[i];
    if (field.tensor == &StepInputs::timesteps) continue;  // finite and in [0, 1]: CheckTimesteps
    PRAXIS_RETURN_IF_ERROR(CheckFinite(in.*field.tensor, field.name, &found.max_abs[i]));
  }
  if (magnitudes != nullptr) *magnitudes = found;
  return absl::OkStatus();
}

}  // namespace praxis::model
