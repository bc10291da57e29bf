#include "model/cpu_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
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
PRAXIS_ISA_CLONES void NormRopeToken(float* x, int64_t heads, int64_t hd, const float* w,
                                     float eps, const float* cos, const float* sin) {
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

template <typename T>
void Load(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
  }
}

template <typename T>
void Store(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

void NormalizeRow(float* x, const float* w, int64_t n, double eps) {
  const float r = 1.0f / std::sqrt(SumSquares(x, n) / static_cast<float>(n) + static_cast<float>(eps));
  ScaleRow(x, w, r, n);
}

// Rows of at least this many elements in all are split across threads.
constexpr int64_t kGrainElements = 16384;

}  // namespace

torch::Tensor RmsNorm(const torch::Tensor& x_in, const torch::Tensor& weight, double eps) {
  // Preconditions of our own callers: a failure throws into Forward's catch (that batch's error).
  TORCH_CHECK(!x_in.is_cuda() && weight.scalar_type() == torch::kFloat32 &&
                  weight.numel() == x_in.size(-1),
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
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElements / n), [&](int64_t a, int64_t b) {
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
  TORCH_CHECK(!x.is_cuda() && x.dim() == 4 && x.stride(3) == 1 && hd % 2 == 0,
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
    at::parallel_for(0, b * t, std::max<int64_t>(1, kGrainElements / (h * hd)), [&](int64_t a,
                                                                                  int64_t e) {
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

}  // namespace praxis::model::cpu
