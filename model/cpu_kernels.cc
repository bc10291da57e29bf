#include "model/cpu_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace praxis::model::cpu {
namespace {

// The row loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time
// (GCC function multi-versioning), so one binary vectorizes on every machine it may land on.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PRAXIS_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PRAXIS_ISA_CLONES
#endif

PRAXIS_ISA_CLONES float SumSquares(const float* x, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

PRAXIS_ISA_CLONES void ScaleRow(float* x, const float* w, float r, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * r * w[i];
}

// `heads` rows of hd floats of one token, in place: each RMS-normalised with w (when not null),
// then y = x·cos + rotate_half(x)·sin with rotate_half(x) = [-x₂, x₁] and the token's cos, sin.
PRAXIS_ISA_CLONES void NormRopeToken(float* x, int64_t heads, int64_t hd, const float* w, float eps,
                                     const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* r = x + h * hd;
    if (w != nullptr) {
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < hd; ++i) ss += r[i] * r[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(hd) + eps);
#pragma omp simd
      for (int64_t i = 0; i < hd; ++i) r[i] = r[i] * inv * w[i];
    }
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = r[i], b = r[i + half];
      r[i] = a * cos[i] - b * sin[i];
      r[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

// Storage conversions, vectorized: bf16 is the top half of a float32 (round to nearest even on
// the way back, NaN kept quiet, as c10::BFloat16 does); fp16 goes through c10::Half's bit
// arithmetic, which the compiler vectorizes inside these clones.
PRAXIS_ISA_CLONES void LoadBf16(const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, sizeof(u));
  }
}

PRAXIS_ISA_CLONES void StoreBf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    dst[i] = static_cast<uint16_t>(src[i] != src[i] ? 0x7FC0u : rounded);
  }
}

PRAXIS_ISA_CLONES void LoadHalf(const c10::Half* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

PRAXIS_ISA_CLONES void StoreHalf(const float* src, c10::Half* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
}

template <typename T>
void Load(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    LoadBf16(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    LoadHalf(src, dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <typename T>
void Store(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    StoreBf16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    StoreHalf(src, dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

// e^x to about one float32 ulp in a form the compiler vectorizes (libm's expf is a call per
// element without -ffast-math): x = n·ln2 + r, |r| <= ln2/2, e^r by Cephes' expf polynomial, then
// scaled by 2·2^(n-1) so that n = 128 (x up to 88.72) stays finite. It overflows to +inf past
// float's range as expf does (so silu of a very negative x is -0, as ATen's); below -86 it stays
// at e^-86, where 1 + e^x is 1 (silu of a very positive x is x exactly).
// `lo` and `hi` are -86 and 89, passed in at run time: given constants, GCC splits the caller's
// loop by the clamp's ranges into three masked paths with a division each (3x the divisions).
inline float VecExp(float x, float lo, float hi) {
  x = std::min(std::max(x, lo), hi);
  constexpr float kMagic = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 126) << 23;  // 2^(n-1)
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return (er * 2.0f) * scale;
}

// VecExp's clamp bounds, read once per row (see VecExp).
volatile float exp_clamp_lo = -86.0f, exp_clamp_hi = 89.0f;

// a[i] = silu(a[i]) · b[i] = a[i] / (1 + e^-a[i]) · b[i]; a NaN stays NaN.
PRAXIS_ISA_CLONES void SiluMulRow(float* a, const float* b, int64_t n) {
  const float lo = exp_clamp_lo, hi = exp_clamp_hi;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] / (1.0f + VecExp(-a[i], lo, hi)) * b[i];
}

// x[i] *= s.
PRAXIS_ISA_CLONES void ScaleBy(float* x, float s, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

// out[i] += w · y[i].
PRAXIS_ISA_CLONES void AxpyRow(float* out, float w, const float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += w * y[i];
}

void NormalizeRow(float* x, const float* w, int64_t n, double eps) {
  const float r =
      1.0f / std::sqrt(SumSquares(x, n) / static_cast<float>(n) + static_cast<float>(eps));
  ScaleRow(x, w, r, n);
}

// Rows of at least this many elements in all are split across threads.
constexpr int64_t kGrainElements = 16384;

// at::parallel_for's grain for rows of `row_elements` each: at least one row.
int64_t RowGrain(int64_t row_elements) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(row_elements, 1));
}

}  // namespace

torch::Tensor RmsNorm(const torch::Tensor& x_in, const torch::Tensor& weight, double eps) {
  // Preconditions of our own callers: a failure throws into Forward's catch (that batch's error).
  TORCH_CHECK(
      !x_in.is_cuda() && weight.scalar_type() == torch::kFloat32 && weight.numel() == x_in.size(-1),
      "cpu::RmsNorm: expected a CPU tensor and a float32 weight of its last dimension");
  RECORD_FUNCTION("praxis::rms_norm", std::vector<c10::IValue>());
  const torch::Tensor x = x_in.contiguous();
  const torch::Tensor w = weight.contiguous();
  torch::Tensor y = torch::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "RmsNorm", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    const float* wp = w.data_ptr<float>();
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t a, int64_t b) {
      std::vector<float> buf(n);
      for (int64_t r = a; r < b; ++r) {
        Load(src + r * n, buf.data(), n);
        NormalizeRow(buf.data(), wp, n, eps);
        Store(buf.data(), dst + r * n, n);
      }
    });
  });
  return y;
}

torch::Tensor NormRopeHeads(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                            const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1), h = x.size(2), hd = x.size(3);
  TORCH_CHECK(
      !x.is_cuda() && x.dim() == 4 && x.stride(3) == 1 && hd % 2 == 0,
      "cpu::NormRopeHeads: expected CPU heads [B, T, H, hd] with unit last stride, even hd");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.size(0) == t && cos.size(1) == hd,
              "cpu::NormRopeHeads: expected contiguous float32 rotary tables [T, hd]");
  TORCH_CHECK(!weight.defined() || (weight.scalar_type() == torch::kFloat32 &&
                                    weight.is_contiguous() && weight.numel() == hd),
              "cpu::NormRopeHeads: expected a float32 norm weight [hd]");
  RECORD_FUNCTION("praxis::norm_rope_heads", std::vector<c10::IValue>());
  torch::Tensor y = torch::empty({b, h, t, hd}, x.options());
  const int64_t sb = x.stride(0), st = x.stride(1), sh = x.stride(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "NormRope", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    const float* wp = weight.defined() ? weight.data_ptr<float>() : nullptr;
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    at::parallel_for(0, b * t, RowGrain(h * hd), [&](int64_t a, int64_t e) {
      std::vector<float> buf(h * hd);
      for (int64_t bt = a; bt < e; ++bt) {
        const int64_t bi = bt / t, ti = bt % t;
        for (int64_t hi = 0; hi < h; ++hi) {
          Load(src + bi * sb + ti * st + hi * sh, buf.data() + hi * hd, hd);
        }
        NormRopeToken(buf.data(), h, hd, wp, static_cast<float>(eps), cp + ti * hd, sp + ti * hd);
        for (int64_t hi = 0; hi < h; ++hi) {
          Store(buf.data() + hi * hd, dst + ((bi * h + hi) * t + ti) * hd, hd);
        }
      }
    });
  });
  return y;
}

torch::Tensor SiluMul(const torch::Tensor& a_in, const torch::Tensor& b_in) {
  TORCH_CHECK(!a_in.is_cuda() && a_in.sizes() == b_in.sizes() &&
                  a_in.scalar_type() == b_in.scalar_type() && a_in.dim() >= 1,
              "cpu::SiluMul: expected two CPU tensors of one shape and dtype");
  RECORD_FUNCTION("praxis::silu_mul", std::vector<c10::IValue>());
  const int64_t n = a_in.size(-1);
  // Rows of a view (the gate and up halves of one projection) keep their stride: no copy.
  auto rows_of = [](const torch::Tensor& t) {
    torch::Tensor r = t.dim() == 1 ? t.unsqueeze(0) : t.flatten(0, -2);
    return r.stride(1) == 1 ? r : r.contiguous();
  };
  const torch::Tensor a = rows_of(a_in), b = rows_of(b_in);
  torch::Tensor y =
      torch::empty(a_in.sizes(), a_in.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t rows = a.size(0), sa = a.stride(0), sb = b.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "SiluMul", [&] {
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t r0, int64_t r1) {
      std::vector<float> fa(n), fb(n);
      for (int64_t r = r0; r < r1; ++r) {
        Load(ap + r * sa, fa.data(), n);
        Load(bp + r * sb, fb.data(), n);
        SiluMulRow(fa.data(), fb.data(), n);
        Store(fa.data(), dst + r * n, n);
      }
    });
  });
  return y;
}

void AddWeightedRows(torch::Tensor& out, const torch::Tensor& rows, const torch::Tensor& weights,
                     const torch::Tensor& y_in) {
  TORCH_CHECK(!out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.is_contiguous() &&
                  out.dim() == 2 && y_in.dim() == 2 && y_in.size(1) == out.size(1) &&
                  rows.scalar_type() == torch::kInt64 && rows.numel() == y_in.size(0) &&
                  weights.scalar_type() == torch::kFloat32 && weights.numel() == y_in.size(0),
              "cpu::AddWeightedRows: expected float32 out [N, d], int64 rows [n], float32 "
              "weights [n] and y [n, d]");
  RECORD_FUNCTION("praxis::add_weighted_rows", std::vector<c10::IValue>());
  const torch::Tensor y = y_in.contiguous();
  const torch::Tensor idx = rows.contiguous();
  const torch::Tensor w = weights.contiguous();
  const int64_t n = y.size(0), d = y.size(1), limit = out.size(0);
  const int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(ip[i] >= 0 && ip[i] < limit, "cpu::AddWeightedRows: row out of range");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "AddRows", [&] {
    const scalar_t* yp = y.data_ptr<scalar_t>();
    const float* wp = w.data_ptr<float>();
    float* op = out.data_ptr<float>();
    // Rows are distinct (one expert's tokens), so threads never write the same row.
    at::parallel_for(0, n, RowGrain(d), [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(d);
      for (int64_t r = r0; r < r1; ++r) {
        Load(yp + r * d, buf.data(), d);
        AxpyRow(op + ip[r] * d, wp[r], buf.data(), d);
      }
    });
  });
}

torch::Tensor GateHeads(const torch::Tensor& o, const torch::Tensor& gate_in) {
  TORCH_CHECK(!o.is_cuda() && o.dim() == 4 && o.stride(3) == 1 && gate_in.dim() == 3 &&
                  gate_in.size(0) == o.size(0) && gate_in.size(1) == o.size(2) &&
                  gate_in.size(2) == o.size(1),
              "cpu::GateHeads: expected CPU heads [B, H, T, hd] with unit last stride and gate "
              "logits [B, T, H]");
  RECORD_FUNCTION("praxis::gate_heads", std::vector<c10::IValue>());
  const int64_t b = o.size(0), h = o.size(1), t = o.size(2), hd = o.size(3);
  // sigmoid(gate) once per (token, head), in float32: [B·T, H], contiguous.
  const torch::Tensor gate = torch::sigmoid(gate_in.to(torch::kFloat32)).contiguous();
  torch::Tensor y = torch::empty({b, t, h * hd}, o.options());
  const int64_t sb = o.stride(0), sh = o.stride(1), st = o.stride(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, o.scalar_type(), "GateHeads", [&] {
    const scalar_t* src = o.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    const float* gp = gate.data_ptr<float>();
    at::parallel_for(0, b * t, RowGrain(h * hd), [&](int64_t a, int64_t e) {
      std::vector<float> buf(hd);
      for (int64_t bt = a; bt < e; ++bt) {
        const int64_t bi = bt / t, ti = bt % t;
        for (int64_t hi = 0; hi < h; ++hi) {
          Load(src + bi * sb + hi * sh + ti * st, buf.data(), hd);
          ScaleBy(buf.data(), gp[bt * h + hi], hd);
          Store(buf.data(), dst + (bt * h + hi) * hd, hd);
        }
      }
    });
  });
  return y;
}

}  // namespace praxis::model::cpu
