#include "model/cpu_kernels.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/intrusive_ptr.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <numbers>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"

namespace praxis::model::cpu {
namespace {

// The row loops are compiled for AVX-512, AVX2 and baseline x86-64 and picked at load time
// (GCC function multi-versioning), so one binary vectorizes on every machine it may land on.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PRAXIS_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PRAXIS_ISA_CLONES
#endif

// Σ a[i]·b[i] (the sum of squares where a is b).
PRAXIS_ISA_CLONES float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// y[i] = x[i] · r · w[i] (y may be x).
PRAXIS_ISA_CLONES void ScaleRow(const float* x, const float* w, float r, float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

// The `heads` rows of hd floats of one token (row h at x + h·sx) into y (row h at y + h·sy; y may
// be x): each RMS-normalised with w (when not null), then y = x·cos + rotate_half(x)·sin with
// rotate_half(x) = [-x₂, x₁] and the token's cos, sin. All heads in one call: a call per head
// (hd 16 on the tiny model) cost more than the rows' arithmetic. Portable: see NormRopeTokenOn.
PRAXIS_ISA_CLONES void NormRopeToken(const float* x, int64_t sx, float* y, int64_t sy,
                                     int64_t heads, int64_t hd, const float* w, float eps,
                                     const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* r = x + h * sx;
    float* o = y + h * sy;
    if (w == nullptr) {
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = r[i], b = r[i + half];
        o[i] = a * cos[i] - b * sin[i];
        o[i + half] = b * cos[i + half] + a * sin[i + half];
      }
      continue;
    }
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < hd; ++i) ss += r[i] * r[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(hd) + eps);
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = r[i] * inv * w[i], b = r[i + half] * inv * w[i + half];
      o[i] = a * cos[i] - b * sin[i];
      o[i + half] = b * cos[i + half] + a * sin[i + half];
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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// x86 with GCC or clang: the AVX-512 paths below are compiled (and taken where the CPU has them).
#define PRAXIS_X86_SIMD 1
// The lanes of a 16-float vector that hold values when `left` of a row remain (all past 16): a
// row's last, partial vector is loaded and stored under it.
constexpr __mmask16 LanesLeft(int64_t left) {
  return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
}
// The same bf16 conversions 16 floats at a time where the CPU has the instructions: the clones
// above run at 256 bits, and the float → bf16 rounding takes ~12 integer instructions per vector
// there against one vcvtneps2bf16 (round to nearest even, as c10; NaN stays NaN; a float32
// subnormal, never a model value, becomes zero). At a bench small B8 bf16 step the clones' two
// conversions were ~10 % of all cycles.
// The bf16 values at src as float32 lanes (those outside m: 0). The masked forms throughout: GCC
// 12 warns of the unmasked ones' undefined source.
inline __attribute__((target("avx512f,avx512vl,avx512bw"), always_inline)) __m512 LoadBf16Lanes(
    const uint16_t* src, __mmask16 m) {
  const __m512i w = _mm512_maskz_cvtepu16_epi32(m, _mm256_maskz_loadu_epi16(m, src));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(m, w, 16));
}

__attribute__((target("avx512f,avx512vl,avx512bw"))) void LoadBf16Avx512(const uint16_t* src,
                                                                         float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = LanesLeft(n - i);
    _mm512_mask_storeu_ps(dst + i, m, LoadBf16Lanes(src + i, m));
  }
}

// The 16 lanes of v rounded to bf16 into dst's lanes under m (round to nearest even, as c10).
inline __attribute__((target("avx512f,avx512bf16,avx512vl,avx512bw"), always_inline)) void
StoreBf16Lanes(uint16_t* dst, __mmask16 m, __m512 v) {
  const __m256bh h = _mm512_cvtneps_pbh(v);
  _mm256_mask_storeu_epi16(dst, m, reinterpret_cast<const __m256i&>(h));
}

// dst = src · s rounded to bf16, in one pass (Store's with s = 1, StoreScaled's).
__attribute__((target("avx512f,avx512bf16,avx512vl,avx512bw"))) void StoreScaledBf16Avx512(
    const float* src, float s, uint16_t* dst, int64_t n) {
  const __m512 scale = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = LanesLeft(n - i);
    StoreBf16Lanes(dst + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src + i), scale));
  }
}

// Whether this CPU runs the AVX-512 conversions above (read once).
bool HasAvx512Bf16Convert() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  return has;
}
#endif

template <typename T>
void Load(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
#if defined(PRAXIS_X86_SIMD)
    if (HasAvx512Bf16Convert())
      return LoadBf16Avx512(reinterpret_cast<const uint16_t*>(src), dst, n);
#endif
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
#if defined(PRAXIS_X86_SIMD)
    if (HasAvx512Bf16Convert()) {
      return StoreScaledBf16Avx512(src, 1.0f, reinterpret_cast<uint16_t*>(dst), n);
    }
#endif
    StoreBf16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    StoreHalf(src, dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
  }
}

// src's n values as floats: src itself when it holds floats, else converted into buf.
template <typename T>
const float* AsFloats(const T* src, float* buf, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return src;
  } else {
    Load(src, buf, n);
    return buf;
  }
}

// `rows` rows of n values (row r at src + r·ss) mapped into dst (row r at dst + r·ds) by
// f(in, in_stride, out, out_stride) over float rows: float32 rows directly (no copies), another
// dtype's converted into buf (rows · n floats), mapped in place, converted back.
template <typename T, typename F>
void MapRows(const T* src, int64_t ss, T* dst, int64_t ds, int64_t rows, int64_t n, float* buf,
             F&& f) {
  if constexpr (std::is_same_v<T, float>) {
    f(src, ss, dst, ds);
  } else {
    for (int64_t r = 0; r < rows; ++r) Load(src + r * ss, buf + r * n, n);
    f(buf, n, buf, n);
    for (int64_t r = 0; r < rows; ++r) Store(buf + r * n, dst + r * ds, n);
  }
}

// One row: MapRows with f(in, out).
template <typename T, typename F>
void MapRow(const T* src, T* dst, int64_t n, float* buf, F&& f) {
  MapRows(src, n, dst, n, 1, n, buf,
          [&](const float* in, int64_t, float* out, int64_t) { f(in, out); });
}

// log2 e: e^x = 2^(x·log2 e), the reduction of both exponentials below (VecExp, Exp2Avx512).
constexpr float kLog2e = 1.44269504088896341f;

// Cephes' expf, evaluated by VecExp: x = n·ln2 + r with
// n = round(x·kLog2e), r = (x - n·kLn2Hi) + n·kLn2Lo (ln2 in two parts for precision), and
// e^r = 1 + r + r²·P(r) with P's coefficients kP (highest first); clamped to [kLo, kHi].
namespace expf_cephes {
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = 2.12194440e-4f;
constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
constexpr float kP[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                        4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
constexpr float kLo = -86.0f, kHi = 89.0f;
}  // namespace expf_cephes

// e^x to about one float32 ulp in a form the compiler vectorizes (libm's expf is a call per
// element without -ffast-math): expf_cephes, then scaled by 2·2^(n-1) so that n = 128 (x up to
// 88.72) stays finite. It overflows to +inf past float's range as expf does (so silu of a very
// negative x is -0, as ATen's); below -86 it stays at e^-86, where 1 + e^x is 1 (silu of a very
// positive x is x exactly).
// `lo` and `hi` are kLo and kHi, passed in at run time: given constants, GCC splits the caller's
// loop by the clamp's ranges into three masked paths with a division each (3x the divisions).
inline float VecExp(float x, float lo, float hi) {
  using namespace expf_cephes;
  x = std::min(std::max(x, lo), hi);
  const float t = x * kLog2e + kRound;
  const float n = t - kRound;
  const float r = (x - n * kLn2Hi) + n * kLn2Lo;
  float p = kP[0];
  for (size_t i = 1; i < std::size(kP); ++i) p = p * r + kP[i];
  const float er = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 126) << 23;  // 2^(n-1)
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return (er * 2.0f) * scale;
}

// VecExp's clamp bounds, read once per row (see VecExp).
volatile float exp_clamp_lo = expf_cephes::kLo, exp_clamp_hi = expf_cephes::kHi;

// y[i] = silu(a[i]) · b[i] = a[i] / (1 + e^-a[i]) · b[i]; a NaN stays NaN. y may be a.
PRAXIS_ISA_CLONES void SiluMulRow(const float* a, const float* b, float* y, int64_t n) {
  const float lo = exp_clamp_lo, hi = exp_clamp_hi;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] / (1.0f + VecExp(-a[i], lo, hi)) * b[i];
}

// y[i] = sigmoid(x[i]) = 1 / (1 + e^-x[i]).
PRAXIS_ISA_CLONES void SigmoidRow(const float* x, float* y, int64_t n) {
  const float lo = exp_clamp_lo, hi = exp_clamp_hi;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + VecExp(-x[i], lo, hi));
}

// Whether a ranks above b as torch::topk ranks them: NaN above every number.
bool RanksAbove(float a, float b) { return (std::isnan(a) && !std::isnan(b)) || a > b; }

// y[i] = shift[i] + x[i] · scale[i] (y may be x).
PRAXIS_ISA_CLONES void ModulateRow(const float* x, const float* shift, const float* scale, float* y,
                                   int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = shift[i] + x[i] * scale[i];
}

// max |x[i]| (reduced as *m), and Σ (x[i] - x[i]), NaN iff some x[i] is NaN or infinite (*bad).
PRAXIS_ISA_CLONES void MaxAbsRow(const float* x, int64_t n, float* m, float* bad) {
  float mx = *m, b = *bad;
#pragma omp simd reduction(max : mx) reduction(+ : b)
  for (int64_t i = 0; i < n; ++i) {
    mx = std::max(mx, std::fabs(x[i]));
    b += x[i] - x[i];
  }
  *m = mx;
  *bad = b;
}

// x[i] *= s.
PRAXIS_ISA_CLONES void ScaleBy(float* x, float s, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

// dst = src · s in T: an attention's output row normalised by its softmax sum, in one pass where
// the CPU rounds to bf16 in AVX-512 (a scale, then a store, took two calls per row of 16 on the
// tiny model); src is scratch and may be overwritten.
template <typename T>
void StoreScaled(float* src, float s, T* dst, int64_t n) {
#if defined(PRAXIS_X86_SIMD)
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (HasAvx512Bf16Convert()) {
      return StoreScaledBf16Avx512(src, s, reinterpret_cast<uint16_t*>(dst), n);
    }
  }
#endif
  ScaleBy(src, s, n);
  Store(src, dst, n);
}

// out[i] += w · y[i].
PRAXIS_ISA_CLONES void AxpyRow(float* out, float w, const float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] += w * y[i];
}

// y = x RMS-normalised, times w (y may be x).
void NormalizeRow(const float* x, const float* w, int64_t n, double eps, float* y) {
  const float r = 1.0f / std::sqrt(Dot(x, x, n) / static_cast<float>(n) + static_cast<float>(eps));
  ScaleRow(x, w, r, y, n);
}

// Attention works in 16-float chunks (one AVX-512 register) over blocks of kBlockRows query rows:
// key columns and head dims are padded to a multiple of kLanes with zeros and query blocks to
// kBlockRows rows, so the inner loops have no tails, and a block's rows are kBlockRows
// independent FMA chains (one chain would wait on each FMA's latency).
constexpr int64_t kLanes = 16;
constexpr int64_t kBlockRows = 8;
// Query rows per attention task (a multiple of kBlockRows): its scores and sums stay in L1.
constexpr int64_t kAttentionRows = 32;
// Query rows per task on the bf16 brgemm (four 16-row AMX tiles), and at most per query tile:
// measured on AMX at the bench layout with segments of 512 keys, 32 rows 476 ms of attention, 64
// 434-439, 128 424-431 (fewer tasks to balance on small layouts) (stop 23); on Zen 4, 32 and 128
// within 2 % of 64 (stop 46).
constexpr int64_t kBrgemmRows = 64;

int64_t PadToLanes(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The steps of one block of kBlockRows query rows against one key segment, portable. The one
// matrix product of attention, out[r, n] = scale[r] · out[r, n] + Σ_i a[r·lda + i] · b[i·ldb + n]
// for r < kBlockRows and n < width (a multiple of kLanes), out rows of ldo; a null scale starts
// from 0. Scores: a = q, b = kᵀ, i over the head dim; values: a = p, b = v, i over the keys.
void BlockProductPortable(const float* a, int64_t lda, const float* b, int64_t ldb, int64_t inner,
                          int64_t width, float* out, int64_t ldo, const float* scale) {
  for (int64_t r = 0; r < kBlockRows; ++r) {
    float* o = out + r * ldo;
    for (int64_t n = 0; n < width; ++n) o[n] = scale == nullptr ? 0.0f : o[n] * scale[r];
    for (int64_t i = 0; i < inner; ++i) {
      for (int64_t n = 0; n < width; ++n) o[n] += a[r * lda + i] * b[i * ldb + n];
    }
  }
}

// Folds a row's new max m' and its sum of e^(x - m') into the running m and l; returns the
// factor that rescales the row's earlier sum and output (0 when nothing was allowed before).
float FoldRow(float* m, float* l, float m_new, float sum) {
  const float alpha = *m == kNegInf ? 0.0f : std::exp(*m - m_new);
  *l = *l * alpha + sum;
  *m = m_new;
  return alpha;
}

// A row's online-softmax step between the two: the scores s (q·kᵀ) give p = e^(s·scale - m')
// where `mask` (padded bytes; null: every column) allows and 0 elsewhere, m and l the running max
// and sum; returns the factor that rescales the row's earlier sum (1 while nothing is allowed).
float SoftmaxRowPortable(const float* s, int64_t padded, const uint8_t* mask, float scale, float* m,
                         float* l, float* p) {
  float mx = kNegInf;
  for (int64_t c = 0; c < padded; ++c) {
    p[c] = mask != nullptr && mask[c] == 0 ? kNegInf : s[c] * scale;
    mx = std::max(mx, p[c]);
  }
  const float m_new = std::max(*m, mx);
  if (m_new == kNegInf) {
    std::fill(p, p + padded, 0.0f);
    return 1.0f;
  }
  float sum = 0;
  for (int64_t c = 0; c < padded; ++c) {
    p[c] = p[c] == kNegInf ? 0.0f : std::exp(p[c] - m_new);
    sum += p[c];
  }
  return FoldRow(m, l, m_new, sum);
}

#if defined(PRAXIS_X86_SIMD)
#define PRAXIS_AVX512 __attribute__((target("avx512f,avx512dq")))
// For the per-vector steps of the softmax loops: GCC does not always inline them there.
#define PRAXIS_AVX512_INLINE inline __attribute__((target("avx512f,avx512dq"), always_inline))

// The same steps in AVX-512 (what every CPU this server is deployed on has, Intel and AMD).
// BlockProduct's rows [r0, r0 + R) and columns [n0, n0 + C·kLanes) in R·C registers: each b load
// serves R rows and each a broadcast C chunks (one load per FMA or fewer: FMA-bound, and R·C
// independent FMA chains, where one chain would wait on each FMA's latency).
template <int R, int C>
PRAXIS_AVX512 void ProductTileAvx512(const float* a, int64_t lda, const float* b, int64_t ldb,
                                     int64_t inner, float* out, int64_t ldo, const float* scale,
                                     int64_t r0, int64_t n0) {
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int t = 0; t < R * C; ++t) {
    float* o = out + (r0 + t / C) * ldo + n0 + (t % C) * kLanes;
    acc[t / C][t % C] = scale == nullptr
                            ? _mm512_setzero_ps()
                            : _mm512_mul_ps(_mm512_loadu_ps(o), _mm512_set1_ps(scale[r0 + t / C]));
  }
  for (int64_t i = 0; i < inner; ++i) {
    __m512 bv[C];
#pragma GCC unroll 4
    for (int j = 0; j < C; ++j) bv[j] = _mm512_loadu_ps(b + i * ldb + n0 + j * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[(r0 + r) * lda + i]);
#pragma GCC unroll 4
      for (int j = 0; j < C; ++j) acc[r][j] = _mm512_fmadd_ps(av, bv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < R * C; ++t) {
    _mm512_storeu_ps(out + (r0 + t / C) * ldo + n0 + (t % C) * kLanes, acc[t / C][t % C]);
  }
}

PRAXIS_AVX512 void BlockProductAvx512(const float* a, int64_t lda, const float* b, int64_t ldb,
                                      int64_t inner, int64_t width, float* out, int64_t ldo,
                                      const float* scale) {
  int64_t n0 = 0;
  for (; n0 + 4 * kLanes <= width; n0 += 4 * kLanes) {
    ProductTileAvx512<4, 4>(a, lda, b, ldb, inner, out, ldo, scale, 0, n0);
    ProductTileAvx512<4, 4>(a, lda, b, ldb, inner, out, ldo, scale, 4, n0);
  }
  for (; n0 < width; n0 += kLanes) {
    ProductTileAvx512<kBlockRows, 1>(a, lda, b, ldb, inner, out, ldo, scale, 0, n0);
  }
}

// Every lane. The masked forms of the intrinsics are used throughout: GCC 12's unmasked ones pass
// an undefined source that its -Wuninitialized reports (and -Werror fails on).
constexpr __mmask16 kAll = 0xFFFF;

// The max and the sum of x's lanes, by halving shuffles.
PRAXIS_AVX512 float HorizontalMax(__m512 x) {
  x = _mm512_mask_max_ps(x, kAll, x, _mm512_mask_shuffle_f32x4(x, kAll, x, x, 0x4E));
  x = _mm512_mask_max_ps(x, kAll, x, _mm512_mask_shuffle_f32x4(x, kAll, x, x, 0xB1));
  x = _mm512_mask_max_ps(x, kAll, x, _mm512_mask_permute_ps(x, kAll, x, 0x4E));
  x = _mm512_mask_max_ps(x, kAll, x, _mm512_mask_permute_ps(x, kAll, x, 0xB1));
  return _mm512_cvtss_f32(x);
}

PRAXIS_AVX512 float HorizontalSum(__m512 x) {
  x = _mm512_add_ps(x, _mm512_mask_shuffle_f32x4(x, kAll, x, x, 0x4E));
  x = _mm512_add_ps(x, _mm512_mask_shuffle_f32x4(x, kAll, x, x, 0xB1));
  x = _mm512_add_ps(x, _mm512_mask_permute_ps(x, kAll, x, 0x4E));
  x = _mm512_add_ps(x, _mm512_mask_permute_ps(x, kAll, x, 0xB1));
  return _mm512_cvtss_f32(x);
}

// Fits of 2^f on [0, 1), highest coefficient first (least squares in relative error at Chebyshev
// nodes): degree 5, relative error 1.6e-7 (evaluated in float32), for float32 probabilities;
// degree 3, 7.7e-5, where they are rounded to bf16 (2^-9) before use: 25x inside that rounding.
constexpr float kExp2Fit5[] = {1.8762329128e-03f, 8.9925844222e-03f, 5.5823605508e-02f,
                               2.4015453458e-01f, 6.9315296412e-01f, 9.9999994040e-01f};
constexpr float kExp2Fit3[] = {7.7907167375e-02f, 2.2623319924e-01f, 6.9577711821e-01f,
                               9.9992781878e-01f};

// Where Exp2Avx512 clamps x: 2^-64 in place of any smaller p changes nothing that a row's sum
// (at least its max term, about 1) could hold in float32 (2^-24), over fewer than 2^40 keys; and
// every p, and every p·v the float32 path accumulates, stays a normal float: a denormal result
// costs a microcode assist per instruction, which made rows whose scores lie far below their max
// (spread 30 in model_bench's BM_SmallAttention) 1.7x slower in float32 and 4.5x in bf16.
constexpr float kExp2Floor = -64.0f;

// 2^x for the attention's x = (s·scale - m)·log2 e (at most kMaxLead), clamped to kExp2Floor:
// 2^floor(x)·P(f) with f = x - floor(x) in [0, 1) by vreduceps and P one of the fits above, the
// 2^floor(x) by vscalefps (which floors x itself). A score of -inf gives 2^kExp2Floor; lanes
// outside `keep` are 0. About half the instructions of expf_cephes' e^x, which needs the two-part
// reduction by ln 2 and the exponent built by integer arithmetic.
template <size_t N>
PRAXIS_AVX512_INLINE __m512 Exp2Avx512(__m512 x, __mmask16 keep, const float (&fit)[N]) {
  x = _mm512_mask_max_ps(x, kAll, x, _mm512_set1_ps(kExp2Floor));
  const __m512 f = _mm512_mask_reduce_ps(x, kAll, x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(fit[0]);
  for (size_t i = 1; i < N; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(fit[i]));
  return _mm512_maskz_scalef_ps(keep, p, x);
}

// RouterRow's AVX-512 steps (see there). Past the last expert the last row is read again (so
// that every chain runs in registers) and its sums are not stored.
PRAXIS_AVX512 void RouterRowAvx512(const float* x, const float* router, int64_t d, int64_t e,
                                   float* out) {
  constexpr int kExperts = 8;
  for (int64_t j0 = 0; j0 < e; j0 += kExperts) {
    const float* rows[kExperts];
    __m512 acc[kExperts];
#pragma GCC unroll 8
    for (int j = 0; j < kExperts; ++j) {
      rows[j] = router + std::min<int64_t>(j0 + j, e - 1) * d;
      acc[j] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < d; i += kLanes) {
      const __mmask16 m = LanesLeft(d - i);
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i);
#pragma GCC unroll 8
      for (int j = 0; j < kExperts; ++j) {
        acc[j] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, rows[j] + i), acc[j]);
      }
    }
    for (int64_t j = 0; j < std::min<int64_t>(kExperts, e - j0); ++j) {
      out[j0 + j] = HorizontalSum(acc[j]);
    }
  }
}

// SiluMulRow in AVX-512: e^-a = 2^n·P(f) with kExp2Fit5 (n = floor(-a·log2 e), f = -a·log2 e - n
// reduced by FMAs, with
// log2 e in two parts: one product rounded to float32 would be ~5e-7 off at a = -9), and
// 1 / (1 + e^-a) by vrcp14ps and one Newton step instead of vdivps, which alone took longer than
// the rest of the row. Where e^-a overflows (a below about -88) the reciprocal is 0 (silu = -0, as
// ATen's); a NaN stays NaN (the product with a). A few float32 ulps of ATen's silu · b.
PRAXIS_AVX512 void SiluMulRowAvx512(const float* a, const float* b, float* out, int64_t n) {
  constexpr float kLog2eLo = 1.92596299e-8f;  // log2 e - kLog2e
  const __m512 log2e = _mm512_set1_ps(kLog2e), log2e_lo = _mm512_set1_ps(kLog2eLo),
               one = _mm512_set1_ps(1.0f), inf = _mm512_set1_ps(INFINITY);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = LanesLeft(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, a + i);
    // -a, capped where e^-a no longer changes 1 + e^-a (a NaN becomes the cap: see above).
    const __m512 neg =
        _mm512_mask_max_ps(x, kAll, _mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(-87.0f));
    const __m512 e2 = _mm512_mask_mul_ps(neg, kAll, neg, log2e);
    const __m512 k =
        _mm512_mask_roundscale_ps(e2, kAll, e2, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_fmadd_ps(neg, log2e_lo, _mm512_fmsub_ps(neg, log2e, k));
    __m512 p = _mm512_set1_ps(kExp2Fit5[0]);
    for (size_t j = 1; j < std::size(kExp2Fit5); ++j) {
      p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Fit5[j]));
    }
    const __m512 d = _mm512_mask_add_ps(one, kAll, one, _mm512_maskz_scalef_ps(kAll, p, k));
    __m512 r = _mm512_maskz_rcp14_ps(kAll, d);
    r = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, one), r);  // r + r·(1 - d·r): one rounding
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(d, inf, _CMP_EQ_OQ), _mm512_setzero_ps());
    const __m512 y = _mm512_mask_mul_ps(x, kAll, _mm512_mask_mul_ps(x, kAll, x, r),
                                        _mm512_maskz_loadu_ps(m, b + i));
    _mm512_mask_storeu_ps(out + i, m, y);
  }
}

// 1 / rms of a head row of hd values from its lanes' sums of squares ss (NormRopeToken's).
PRAXIS_AVX512_INLINE __m512 InvRms(__m512 ss, int64_t hd, float eps) {
  return _mm512_set1_ps(1.0f / std::sqrt(HorizontalSum(ss) / static_cast<float>(hd) + eps));
}

// NormRopeToken's output lanes [i, i + 16) of a head row's two halves from the input's a and b
// (lanes under m): normalised by inv and w first where w is not null, then rotated by cos, sin.
PRAXIS_AVX512_INLINE void RopeLanes(__m512 a, __m512 b, __m512 inv, const float* w,
                                    const float* cos, const float* sin, int64_t i, int64_t half,
                                    __mmask16 m, __m512* lo, __m512* hi) {
  if (w != nullptr) {
    a = _mm512_mul_ps(_mm512_mul_ps(a, inv), _mm512_maskz_loadu_ps(m, w + i));
    b = _mm512_mul_ps(_mm512_mul_ps(b, inv), _mm512_maskz_loadu_ps(m, w + i + half));
  }
  *lo = _mm512_fmsub_ps(a, _mm512_maskz_loadu_ps(m, cos + i),
                        _mm512_mul_ps(b, _mm512_maskz_loadu_ps(m, sin + i)));
  *hi = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m, cos + i + half),
                        _mm512_mul_ps(a, _mm512_maskz_loadu_ps(m, sin + i + half)));
}

// NormRopeToken in AVX-512, a row's halves 16 lanes at a time (masked at the ends: the tiny
// model's hd 16 has halves of 8, which the clones' loops ran as scalars, ~5 % of its step).
PRAXIS_AVX512 void NormRopeTokenAvx512(const float* x, int64_t sx, float* y, int64_t sy,
                                       int64_t heads, int64_t hd, const float* w, float eps,
                                       const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* r = x + h * sx;
    float* o = y + h * sy;
    __m512 inv = _mm512_set1_ps(1.0f);
    if (w != nullptr) {
      __m512 ss = _mm512_setzero_ps();
      for (int64_t i = 0; i < hd; i += kLanes) {
        const __m512 v = _mm512_maskz_loadu_ps(LanesLeft(hd - i), r + i);
        ss = _mm512_fmadd_ps(v, v, ss);
      }
      inv = InvRms(ss, hd, eps);
    }
    for (int64_t i = 0; i < half; i += kLanes) {
      const __mmask16 m = LanesLeft(half - i);
      __m512 lo, hi;
      RopeLanes(_mm512_maskz_loadu_ps(m, r + i), _mm512_maskz_loadu_ps(m, r + i + half), inv, w,
                cos, sin, i, half, m, &lo, &hi);
      _mm512_mask_storeu_ps(o + i, m, lo);
      _mm512_mask_storeu_ps(o + i + half, m, hi);
    }
  }
}

// NormRopeTokenAvx512 for bf16 heads, each vector widened on load and rounded once on store:
// through float32 buffers (MapRows) a bf16 token took 3x a float32 one at hd 16 (stop 56).
__attribute__((target("avx512f,avx512dq,avx512bf16,avx512vl,avx512bw"))) void
NormRopeTokenBf16Avx512(const uint16_t* x, int64_t sx, uint16_t* y, int64_t sy, int64_t heads,
                        int64_t hd, const float* w, float eps, const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const uint16_t* r = x + h * sx;
    uint16_t* o = y + h * sy;
    __m512 inv = _mm512_set1_ps(1.0f);
    if (w != nullptr) {
      __m512 ss = _mm512_setzero_ps();
      for (int64_t i = 0; i < hd; i += kLanes) {
        const __m512 v = LoadBf16Lanes(r + i, LanesLeft(hd - i));
        ss = _mm512_fmadd_ps(v, v, ss);
      }
      inv = InvRms(ss, hd, eps);
    }
    for (int64_t i = 0; i < half; i += kLanes) {
      const __mmask16 m = LanesLeft(half - i);
      __m512 lo, hi;
      RopeLanes(LoadBf16Lanes(r + i, m), LoadBf16Lanes(r + i + half, m), inv, w, cos, sin, i, half,
                m, &lo, &hi);
      StoreBf16Lanes(o + i, m, lo);
      StoreBf16Lanes(o + i + half, m, hi);
    }
  }
}

// 16 lanes from src as float32 (those outside m: 0): float32 as it lies, bf16 widened.
inline __attribute__((target("avx512f,avx512vl,avx512bw"), always_inline)) __m512 LoadLanes(
    const float* src, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, src);
}
inline __attribute__((target("avx512f,avx512vl,avx512bw"), always_inline)) __m512 LoadLanes(
    const uint16_t* src, __mmask16 m) {
  return LoadBf16Lanes(src, m);
}

// SiluMulRowAvx512 rounded to bf16, in one pass from bf16 rows or float32 sums (T: uint16_t bf16
// bits or float; each vector converted on load and rounded once on store): as the result is
// rounded to bf16 (2^-9), e^-a takes kExp2Fit3 on one product by log2 e and 1 / (1 + e^-a)
// vrcp14ps alone (relative errors 7.7e-5, <= 6e-6 and 2^-14, all well inside the rounding).
// Converting bf16 rows to float32 buffers and back around the float32 kernel took 1.4x its time;
// the bf16 SwiGLU's float32 sums went through SiluMulRowAvx512 and a rounding pass (stop 51).
template <typename T>
__attribute__((target("avx512f,avx512dq,avx512bf16,avx512vl,avx512bw"))) void SiluMulRowBf16Avx512(
    const T* a, const T* b, uint16_t* out, int64_t n) {
  const __m512 log2e = _mm512_set1_ps(kLog2e), one = _mm512_set1_ps(1.0f),
               inf = _mm512_set1_ps(INFINITY);
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = LanesLeft(n - i);
    const __m512 x = LoadLanes(a + i, m);
    // -a capped as in SiluMulRowAvx512 (a NaN becomes the cap and stays NaN through x).
    const __m512 neg =
        _mm512_mask_max_ps(x, kAll, _mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(-87.0f));
    const __m512 d = _mm512_add_ps(one, Exp2Avx512(_mm512_mul_ps(neg, log2e), kAll, kExp2Fit3));
    __m512 r = _mm512_maskz_rcp14_ps(kAll, d);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(d, inf, _CMP_EQ_OQ), _mm512_setzero_ps());
    StoreBf16Lanes(out + i, m, _mm512_mul_ps(_mm512_mul_ps(x, r), LoadLanes(b + i, m)));
  }
}

// NormalizeRow for a bf16 row, each vector converted on load and rounded once on store, as
// SiluMulRowBf16Avx512: through float32 buffers (MapRow) a bf16 row took 1.5x a float32 row's time
// (bench small B8, stop 47), where it reads and writes half the bytes.
__attribute__((target("avx512f,avx512dq,avx512bf16,avx512vl,avx512bw"))) void
NormalizeRowBf16Avx512(const uint16_t* x, const float* w, int64_t n, float eps, uint16_t* y) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += kLanes) {
    const __m512 v = LoadBf16Lanes(x + i, LanesLeft(n - i));
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const __m512 r =
      _mm512_set1_ps(1.0f / std::sqrt(HorizontalSum(ss) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = LanesLeft(n - i);
    StoreBf16Lanes(
        y + i, m,
        _mm512_mul_ps(_mm512_mul_ps(LoadBf16Lanes(x + i, m), r), _mm512_maskz_loadu_ps(m, w + i)));
  }
}

// ModulateRow for a bf16 row, in one pass as NormalizeRowBf16Avx512.
__attribute__((target("avx512f,avx512dq,avx512bf16,avx512vl,avx512bw"))) void ModulateRowBf16Avx512(
    const uint16_t* x, const float* shift, const float* scale, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = LanesLeft(n - i);
    StoreBf16Lanes(y + i, m,
                   _mm512_fmadd_ps(LoadBf16Lanes(x + i, m), _mm512_maskz_loadu_ps(m, scale + i),
                                   _mm512_maskz_loadu_ps(m, shift + i)));
  }
}

// `mask`'s 16 bytes from column c as lanes (0 where not allowed); every lane without a mask.
PRAXIS_AVX512_INLINE __mmask16 AllowedLanes(const uint8_t* mask, int64_t c) {
  if (mask == nullptr) return kAll;
  const __m512i allowed =
      _mm512_maskz_cvtepu8_epi32(kAll, _mm_loadu_si128(reinterpret_cast<const __m128i*>(mask + c)));
  return _mm512_test_epi32_mask(allowed, allowed);
}

// The max of a row's allowed scores, times scale (> 0): -inf where none is allowed. Two
// accumulators, so that consecutive maxes do not wait on each other.
PRAXIS_AVX512_INLINE float MaskedRowMax(const float* s, int64_t padded, const uint8_t* mask,
                                        float scale) {
  __m512 mx0 = _mm512_set1_ps(kNegInf), mx1 = mx0;
  int64_t c = 0;
  for (; c + 2 * kLanes <= padded; c += 2 * kLanes) {
    mx0 = _mm512_mask_max_ps(mx0, AllowedLanes(mask, c), mx0, _mm512_loadu_ps(s + c));
    mx1 = _mm512_mask_max_ps(mx1, AllowedLanes(mask, c + kLanes), mx1,
                             _mm512_loadu_ps(s + c + kLanes));
  }
  if (c < padded) mx0 = _mm512_mask_max_ps(mx0, AllowedLanes(mask, c), mx0, _mm512_loadu_ps(s + c));
  return HorizontalMax(_mm512_mask_max_ps(mx0, kAll, mx0, mx1)) * scale;
}

// How far (log2 units) the one-pass softmax steps let a score lead the max they run against.
constexpr float kMaxLead = 16.0f;

// Whether a one-pass exp's sum says that some p may exceed 2^kMaxLead (every p <= the sum): then
// the pass runs again against the row's own max. It fires wherever a score leads by more, and
// also where many smaller p add past 2^kMaxLead (a harmless rerun); against the row's own max the
// sum is at most the row's width, so only a stale max can make it fire. NaN reads as a lead.
inline bool SumLeads(float sum) { return !(sum <= std::exp2(kMaxLead)); }

// e^(s·scale - m) for the 16 columns from c as factor = scale·log2 e and shift = m·log2 e give
// them, 0 on the lanes `mask` does not allow (kMasked; without, every lane: the exp loops below
// are instantiated both ways, so that a segment without a mask runs no per-vector branch).
template <bool kMasked, size_t N>
PRAXIS_AVX512_INLINE __m512 MaskedExp(const float* s, const uint8_t* mask, int64_t c, __m512 factor,
                                      __m512 shift, const float (&fit)[N]) {
  const __m512 x = _mm512_fmsub_ps(_mm512_loadu_ps(s + c), factor, shift);
  return Exp2Avx512(x, kMasked ? AllowedLanes(mask, c) : kAll, fit);
}

// The exp pass of SoftmaxRowAvx512 against max m: p = e^(s·scale - m) on the allowed lanes,
// float32, 32 columns per iteration with two sums (one chain of adds would wait on each add's
// latency). Returns the sum of p.
template <bool kMasked>
PRAXIS_AVX512 float ExpRowToFloat(const float* s, int64_t padded, const uint8_t* mask, float scale,
                                  float m, float* p) {
  const __m512 factor = _mm512_set1_ps(scale * kLog2e), shift = _mm512_set1_ps(m * kLog2e);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;
  int64_t c = 0;
  for (; c + 2 * kLanes <= padded; c += 2 * kLanes) {
    const __m512 e0 = MaskedExp<kMasked>(s, mask, c, factor, shift, kExp2Fit5);
    const __m512 e1 = MaskedExp<kMasked>(s, mask, c + kLanes, factor, shift, kExp2Fit5);
    _mm512_storeu_ps(p + c, e0);
    _mm512_storeu_ps(p + c + kLanes, e1);
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
  }
  if (c < padded) {
    const __m512 e0 = MaskedExp<kMasked>(s, mask, c, factor, shift, kExp2Fit5);
    _mm512_storeu_ps(p + c, e0);
    sum0 = _mm512_add_ps(sum0, e0);
  }
  return HorizontalSum(_mm512_add_ps(sum0, sum1));
}

// SoftmaxRowPortable's step, in one pass where it can: against a reference max, the row's max
// so far or on its first segment the largest of its first allowed 16 scores, p may exceed 1 by up
// to 2^kMaxLead (far inside float32's range: l and the output scale alike, no precision lost).
// Only where the sum says a score may lead the reference by more (SumLeads) does the row run
// again, in two passes: its max, then p.
PRAXIS_AVX512 float SoftmaxRowAvx512(const float* s, int64_t padded, const uint8_t* mask,
                                     float scale, float* m, float* l, float* p) {
  float ref = *m;
  if (ref == kNegInf) {
    const __m512 none = _mm512_set1_ps(kNegInf);
    ref = HorizontalMax(_mm512_mask_max_ps(none, AllowedLanes(mask, 0), none, _mm512_loadu_ps(s))) *
          scale;
  }
  for (bool tried = false;; tried = true) {
    if (ref == kNegInf) {
      ref = std::max(*m, MaskedRowMax(s, padded, mask, scale));
      if (ref == kNegInf) {
        std::fill(p, p + padded, 0.0f);
        return 1.0f;
      }
    }
    const float sum = mask != nullptr ? ExpRowToFloat<true>(s, padded, mask, scale, ref, p)
                                      : ExpRowToFloat<false>(s, padded, mask, scale, ref, p);
    if (tried || !SumLeads(sum)) return FoldRow(m, l, ref, sum);  // ref >= *m
    ref = kNegInf;  // a score may lead by more: again against the row's own max
  }
}

// ExpRowToFloat's pass with p rounded to bf16 (to nearest even, by the CPU's AVX512-BF16
// conversion, which HasBf16Brgemm asks for); the exp to kExp2Fit3, inside that rounding.
template <bool kMasked>
__attribute__((target("avx512f,avx512dq,avx512bf16"))) float ExpRowToBf16Pass(
    const float* s, int64_t padded, const uint8_t* mask, float scale, float m, at::BFloat16* p) {
  const __m512 factor = _mm512_set1_ps(scale * kLog2e), shift = _mm512_set1_ps(m * kLog2e);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = sum0;
  int64_t c = 0;
  for (; c + 2 * kLanes <= padded; c += 2 * kLanes) {
    const __m512 e0 = MaskedExp<kMasked>(s, mask, c, factor, shift, kExp2Fit3);
    const __m512 e1 = MaskedExp<kMasked>(s, mask, c + kLanes, factor, shift, kExp2Fit3);
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
    _mm512_storeu_si512(p + c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e1, e0)));
  }
  if (c < padded) {
    const __m512 e0 = MaskedExp<kMasked>(s, mask, c, factor, shift, kExp2Fit3);
    sum0 = _mm512_add_ps(sum0, e0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + c),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(e0)));
  }
  return HorizontalSum(_mm512_add_ps(sum0, sum1));
}

// ExpRowToBf16Pass with or without a mask (null: every lane allowed).
__attribute__((target("avx512f,avx512dq,avx512bf16"))) float ExpRowToBf16(
    const float* s, int64_t padded, const uint8_t* mask, float scale, float m, at::BFloat16* p) {
  return mask != nullptr ? ExpRowToBf16Pass<true>(s, padded, mask, scale, m, p)
                         : ExpRowToBf16Pass<false>(s, padded, mask, scale, m, p);
}

// The softmax step for the bf16 brgemm, p written as bf16. Once a row has a max m, its later
// segments run against it in one pass: no max pass and no rescaling (alpha 1), p up to
// 2^kMaxLead (far inside float32's and bf16's range, no precision lost: l and the output scale
// alike). Only a segment whose sum says a score may lead by more runs again against its own max.
PRAXIS_AVX512 float SoftmaxRowToBf16(const float* s, int64_t padded, const uint8_t* mask,
                                     float scale, float* m, float* l, at::BFloat16* p) {
  if (*m != kNegInf) {
    const float sum = ExpRowToBf16(s, padded, mask, scale, *m, p);
    if (!SumLeads(sum)) {
      *l += sum;
      return 1.0f;
    }
  }
  const float m_new = std::max(*m, MaskedRowMax(s, padded, mask, scale));
  if (m_new == kNegInf) {
    std::fill(p, p + padded, at::BFloat16(0.0f));
    return 1.0f;
  }
  return FoldRow(m, l, m_new, ExpRowToBf16(s, padded, mask, scale, m_new, p));
}

#endif

// Whether this CPU has AVX-512F and DQ (read once): the kernels' *Avx512 rows need them (DQ for
// vreduceps in Exp2Avx512; every AVX-512 CPU since Skylake-SP has both).
bool HasAvx512() {
#if defined(PRAXIS_X86_SIMD)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}

// Whether TileAttention takes the AVX-512 steps: this CPU has them and the caller allows them.
bool UseAvx512(AttentionIsa isa) { return isa != AttentionIsa::kPortable && HasAvx512(); }

// out[j] = x · router[j] for the E rows of router ([E, d], float32), one token. In AVX-512, eight
// experts at a time, each its own FMA chain: one dot product after another waited on every FMA's
// latency (3 ms of a bench-layout step, against ~0.3 ms for the float32 matmul it replaced).
void RouterRow(const float* x, const float* router, int64_t d, int64_t e, float* out) {
#if defined(PRAXIS_X86_SIMD)
  if (HasAvx512()) return RouterRowAvx512(x, router, d, e, out);
#endif
  for (int64_t j = 0; j < e; ++j) out[j] = Dot(x, router + j * d, d);
}

// NormRopeToken in AVX-512 where `avx512` (UseAvx512), else by the clones.
void NormRopeTokenOn(bool avx512, const float* x, int64_t sx, float* y, int64_t sy, int64_t heads,
                     int64_t hd, const float* w, float eps, const float* cos, const float* sin) {
#if defined(PRAXIS_X86_SIMD)
  if (avx512) return NormRopeTokenAvx512(x, sx, y, sy, heads, hd, w, eps, cos, sin);
#endif
  NormRopeToken(x, sx, y, sy, heads, hd, w, eps, cos, sin);
}

// y[i] = silu(a[i]) · b[i] in AVX-512 where the CPU has it, else by the clones; y may be a.
void SiluMulRowBest(const float* a, const float* b, float* y, int64_t n) {
#if defined(PRAXIS_X86_SIMD)
  if (HasAvx512()) return SiluMulRowAvx512(a, b, y, n);
#endif
  SiluMulRow(a, b, y, n);
}

// y[i] = silu(a[i]) · b[i] rounded to bf16, in one pass where the CPU has the conversion; a is
// scratch (overwritten where it has not).
void SiluMulRowToBf16(float* a, const float* b, c10::BFloat16* y, int64_t n) {
#if defined(PRAXIS_X86_SIMD)
  if (HasAvx512Bf16Convert()) {
    return SiluMulRowBf16Avx512(a, b, reinterpret_cast<uint16_t*>(y), n);
  }
#endif
  SiluMulRowBest(a, b, a, n);
  Store(a, y, n);
}

// ShiftAndScale's rows: each row's first dim values to shift, its next dim plus one to scale.
template <typename T>
void ShiftAndScaleRows(const T* src, int64_t stride, int64_t rows, int64_t dim, float* shift,
                       float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    Load(src + r * stride, shift + r * dim, dim);
    float* s = scale + r * dim;
    Load(src + r * stride + dim, s, dim);
    for (int64_t i = 0; i < dim; ++i) s[i] += 1.0F;
  }
}

// Rows of at least this many elements in all are split across threads.
constexpr int64_t kGrainElements = 16384;

// at::parallel_for's grain for rows of `row_elements` each: at least one row.
int64_t RowGrain(int64_t row_elements) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(row_elements, 1));
}

}  // namespace

double MaxAbs(const torch::Tensor& x_in) {
  TORCH_CHECK(!x_in.is_cuda(), "cpu::MaxAbs: expected a CPU tensor");
  const torch::Tensor x = x_in.contiguous();
  const int64_t n = x.numel();
  struct Partial {
    float max = 0, bad = 0;
  };
  Partial total;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "MaxAbs", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    constexpr int64_t kChunk = 4096;  // floats converted at a time, in L1
    total = at::parallel_reduce(
        0, n, kGrainElements * 4, Partial{},
        [&](int64_t a, int64_t b, Partial p) {
          std::vector<float> buf(std::min(kChunk, b - a));
          for (int64_t i = a; i < b; i += kChunk) {
            const int64_t len = std::min(kChunk, b - i);
            MaxAbsRow(AsFloats(src + i, buf.data(), len), len, &p.max, &p.bad);
          }
          return p;
        },
        [](Partial p, Partial q) {
          return Partial{std::max(p.max, q.max), p.bad + q.bad};
        });
  });
  if (!std::isnan(total.bad)) return total.max;
  return std::isinf(total.max) ? total.max : std::numeric_limits<double>::quiet_NaN();
}

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
#if defined(PRAXIS_X86_SIMD)
  if (x.scalar_type() == at::kBFloat16 && HasAvx512Bf16Convert()) {
    const auto* src = reinterpret_cast<const uint16_t*>(x.const_data_ptr<c10::BFloat16>());
    auto* dst = reinterpret_cast<uint16_t*>(y.mutable_data_ptr<c10::BFloat16>());
    const float* wp = w.const_data_ptr<float>();
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        NormalizeRowBf16Avx512(src + r * n, wp, n, static_cast<float>(eps), dst + r * n);
      }
    });
    return y;
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "RmsNorm", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    const float* wp = w.data_ptr<float>();
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t a, int64_t b) {
      std::vector<float> buf(n);
      for (int64_t r = a; r < b; ++r) {
        MapRow(src + r * n, dst + r * n, n, buf.data(),
               [&](const float* in, float* out) { NormalizeRow(in, wp, n, eps, out); });
      }
    });
  });
  return y;
}

torch::Tensor NormRopeHeads(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                            const torch::Tensor& cos, const torch::Tensor& sin, AttentionIsa isa) {
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
  const bool avx512 = UseAvx512(isa);
  const float* wp = weight.defined() ? weight.const_data_ptr<float>() : nullptr;
  const float* cp = cos.const_data_ptr<float>();
  const float* sp = sin.const_data_ptr<float>();
  const auto feps = static_cast<float>(eps);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "NormRope", [&] {
    const scalar_t* src = x.const_data_ptr<scalar_t>();
    scalar_t* dst = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, b * t, RowGrain(h * hd), [&](int64_t a, int64_t e) {
      std::vector<float> buf;  // MapRows' float rows, sized where a token takes that path
      for (int64_t bt = a; bt < e; ++bt) {
        const int64_t bi = bt / t, ti = bt % t;
        // The token's heads: in at its projection row, out as row ti of each head's [T, hd].
        const scalar_t* in = src + bi * sb + ti * st;
        scalar_t* out = dst + (bi * h * t + ti) * hd;
#if defined(PRAXIS_X86_SIMD)
        if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
          if (avx512 && HasAvx512Bf16Convert()) {
            NormRopeTokenBf16Avx512(reinterpret_cast<const uint16_t*>(in), sh,
                                    reinterpret_cast<uint16_t*>(out), t * hd, h, hd, wp, feps,
                                    cp + ti * hd, sp + ti * hd);
            continue;
          }
        }
#endif
        if constexpr (!std::is_same_v<scalar_t, float>) buf.resize(h * hd);
        MapRows(in, sh, out, t * hd, h, hd, buf.data(),
                [&](const float* x, int64_t sx, float* y, int64_t sy) {
                  NormRopeTokenOn(avx512, x, sx, y, sy, h, hd, wp, feps, cp + ti * hd,
                                  sp + ti * hd);
                });
      }
    });
  });
  return y;
}

torch::Tensor Modulate(const torch::Tensor& x_in, const torch::Tensor& shift_in,
                       const torch::Tensor& scale_in, const torch::Tensor& out) {
  TORCH_CHECK(
      !x_in.is_cuda() && x_in.dim() >= 1 && shift_in.scalar_type() == torch::kFloat32 &&
          scale_in.scalar_type() == torch::kFloat32 && shift_in.size(-1) == x_in.size(-1) &&
          scale_in.size(-1) == x_in.size(-1),
      "cpu::Modulate: expected a CPU tensor and float32 shift, scale of its last dimension");
  TORCH_CHECK(!out.defined() || (!out.is_cuda() && out.sizes() == x_in.sizes() &&
                                 out.scalar_type() == x_in.scalar_type() && out.stride(-1) == 1),
              "cpu::Modulate: expected out of x's sizes and dtype with unit-stride rows");
  RECORD_FUNCTION("praxis::modulate", std::vector<c10::IValue>());
  // Rows keep their strides (zero where shift and scale are broadcast): no copy of either.
  const torch::Tensor x = x_in.stride(-1) == 1 ? x_in : x_in.contiguous();
  auto rows_of = [&](const torch::Tensor& t) {
    return (t.stride(-1) == 1 ? t : t.contiguous()).expand(x.sizes());
  };
  const torch::Tensor shift = rows_of(shift_in), scale = rows_of(scale_in);
  torch::Tensor y =
      out.defined()
          ? out
          : torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t n = x.size(-1), lead = x.dim() - 1, rows = x.numel() / std::max<int64_t>(n, 1);
  const c10::IntArrayRef size = x.sizes(), sx = x.strides(), ssh = shift.strides(),
                         ssc = scale.strides(), sy = y.strides();
#if defined(PRAXIS_X86_SIMD)
  // bf16 rows in one pass each (ModulateRowBf16Avx512), not through a float32 buffer.
  const bool bf16_rows = HasAvx512Bf16Convert();
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "Modulate", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    const float* shp = shift.data_ptr<float>();
    const float* scp = scale.data_ptr<float>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(n);
      for (int64_t r = r0; r < r1; ++r) {
        // Row r's offsets in x, shift and scale: its index over the leading dimensions.
        int64_t rest = r, ox = 0, osh = 0, osc = 0, oy = 0;
        for (int64_t d = lead - 1; d >= 0; --d) {
          const int64_t i = rest % size[d];
          rest /= size[d];
          ox += i * sx[d];
          osh += i * ssh[d];
          osc += i * ssc[d];
          oy += i * sy[d];
        }
#if defined(PRAXIS_X86_SIMD)
        if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
          if (bf16_rows) {
            ModulateRowBf16Avx512(reinterpret_cast<const uint16_t*>(src + ox), shp + osh, scp + osc,
                                  reinterpret_cast<uint16_t*>(dst + oy), n);
            continue;
          }
        }
#endif
        MapRow(src + ox, dst + oy, n, buf.data(),
               [&](const float* in, float* out) { ModulateRow(in, shp + osh, scp + osc, out, n); });
      }
    });
  });
  return y;
}

torch::Tensor FourierFeatures(const torch::Tensor& t_in, const torch::Tensor& freqs,
                              const torch::Tensor& phases, torch::ScalarType dtype) {
  const int64_t d = freqs.numel();
  TORCH_CHECK(!t_in.is_cuda() && freqs.scalar_type() == torch::kFloat32 &&
                  phases.scalar_type() == torch::kFloat32 && phases.numel() == d,
              "cpu::FourierFeatures: expected CPU times and float32 freqs, phases of one size");
  const torch::Tensor t = t_in.to(torch::kFloat32).contiguous();
  const torch::Tensor f = freqs.contiguous(), ph = phases.contiguous();
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape.push_back(d);
  torch::Tensor y = torch::empty(shape, t.options().dtype(dtype));
  const float* tp = t.const_data_ptr<float>();
  const float* fp = f.const_data_ptr<float>();
  const float* pp = ph.const_data_ptr<float>();
  // The reference's float32 ops in its order: (t·freqs + phases), times 2π, cos, times 0.5.
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  std::vector<float> row(d);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, dtype, "FourierFeatures", [&] {
    scalar_t* dst = y.mutable_data_ptr<scalar_t>();
    for (int64_t r = 0; r < t.numel(); ++r) {
      for (int64_t i = 0; i < d; ++i) {
        const float angle = two_pi * (tp[r] * fp[i] + pp[i]);
        row[i] = 0.5F * std::cos(angle);
      }
      Store(row.data(), dst + r * d, d);
    }
  });
  return y;
}

std::pair<torch::Tensor, torch::Tensor> ShiftAndScale(const torch::Tensor& mod_in) {
  TORCH_CHECK(!mod_in.is_cuda() && mod_in.dim() >= 1 && mod_in.size(-1) % 2 == 0,
              "cpu::ShiftAndScale: expected a CPU tensor of an even last dimension");
  const torch::Tensor mod = mod_in.stride(-1) == 1 ? mod_in : mod_in.contiguous();
  const int64_t dim = mod.size(-1) / 2, rows = mod.numel() / std::max<int64_t>(1, 2 * dim);
  std::vector<int64_t> shape(mod.sizes().begin(), mod.sizes().end());
  shape.back() = dim;
  torch::Tensor shift = torch::empty(shape, mod.options().dtype(torch::kFloat32));
  torch::Tensor scale = torch::empty(shape, mod.options().dtype(torch::kFloat32));
  // Its rows one after another (a view where mod's leading dimensions allow).
  const torch::Tensor m2 = mod.reshape({rows, 2 * dim});
  float* sh = shift.mutable_data_ptr<float>();
  float* sc = scale.mutable_data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, mod.scalar_type(), "ShiftAndScale",
      [&] { ShiftAndScaleRows(m2.const_data_ptr<scalar_t>(), m2.stride(0), rows, dim, sh, sc); });
  return {shift, scale};
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
  if (a.scalar_type() == at::kFloat) {
    // Straight from the rows into the output: float32 needs no row buffers.
    const float* ap = a.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* dst = y.data_ptr<float>();
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) SiluMulRowBest(ap + r * sa, bp + r * sb, dst + r * n, n);
    });
    return y;
  }
#if defined(PRAXIS_X86_SIMD)
  if (a.scalar_type() == at::kBFloat16 && HasAvx512Bf16Convert()) {
    const auto* ap = reinterpret_cast<const uint16_t*>(a.const_data_ptr<c10::BFloat16>());
    const auto* bp = reinterpret_cast<const uint16_t*>(b.const_data_ptr<c10::BFloat16>());
    auto* dst = reinterpret_cast<uint16_t*>(y.mutable_data_ptr<c10::BFloat16>());
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        SiluMulRowBf16Avx512(ap + r * sa, bp + r * sb, dst + r * n, n);
    });
    return y;
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, a.scalar_type(), "SiluMul", [&] {
    const scalar_t* ap = a.data_ptr<scalar_t>();
    const scalar_t* bp = b.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    at::parallel_for(0, rows, RowGrain(n), [&](int64_t r0, int64_t r1) {
      std::vector<float> fa(n), fb(n);
      for (int64_t r = r0; r < r1; ++r) {
        Load(ap + r * sa, fa.data(), n);
        Load(bp + r * sb, fb.data(), n);
        SiluMulRowBest(fa.data(), fb.data(), fa.data(), n);
        Store(fa.data(), dst + r * n, n);
      }
    });
  });
  return y;
}

void RunTasks(int64_t count, const std::function<void(int64_t)>& task) {
  std::atomic<int64_t> next{0};
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, std::min<int64_t>(count, at::get_num_threads()), 1, [&](int64_t, int64_t) {
    // Inference and grad mode are thread-local: the caller's guards do not reach the other
    // threads (a task's LibTorch ops would bump an inference tensor's version outside the mode).
    c10::InferenceMode inference_mode(inference);
    c10::AutoGradMode no_grad(false);
    for (int64_t i = next++; i < count; i = next++) task(i);
  });
}

namespace {

// sum_row = residual_row + acc (d floats), through `scratch` (d floats), in T: AddRoutedRows'
// residual add, its dtype picked once per call.
template <typename T>
void ResidualRow(const void* residual_row, const float* acc, void* sum_row, int64_t d,
                 float* scratch) {
  Load(static_cast<const T*>(residual_row), scratch, d);
  AxpyRow(scratch, 1.0f, acc, d);
  Store(scratch, static_cast<T*>(sum_row), d);
}

}  // namespace

torch::Tensor AddRoutedRows(torch::Tensor& out, const ExpertRoutes& r, const torch::Tensor& y,
                            const torch::Tensor& residual) {
  const int64_t pairs = r.tokens.numel();
  TORCH_CHECK(!out.is_cuda() && out.scalar_type() == torch::kFloat32 && out.is_contiguous() &&
                  out.dim() == 2 && y.dim() == 2 && y.size(0) == pairs &&
                  y.size(1) == out.size(1) && y.stride(1) == 1 && r.top_k > 0 &&
                  out.size(0) * r.top_k == pairs &&
                  static_cast<int64_t>(r.places.size()) == pairs && r.weights.numel() == pairs,
              "cpu::AddRoutedRows: expected float32 out [N, d], routes of N·top_k pairs and "
              "y [N·top_k, d]");
  TORCH_CHECK(!residual.defined() ||
                  (!residual.is_cuda() && residual.sizes() == out.sizes() &&
                   residual.stride(1) == 1 && at::isFloatingType(residual.scalar_type())),
              "cpu::AddRoutedRows: expected a float residual [N, d] with unit-stride rows");
  RECORD_FUNCTION("praxis::add_routed_rows", std::vector<c10::IValue>());
  const int64_t d = out.size(1), k = r.top_k, sy = y.stride(0);
  for (int64_t p : r.places) TORCH_CHECK(p >= 0 && p < pairs, "cpu::AddRoutedRows: bad routes");
  torch::Tensor sum = out;
  void (*residual_row)(const void*, const float*, void*, int64_t, float*) = nullptr;
  const char* rp = nullptr;
  char* sp = nullptr;
  int64_t rstride = 0, sstride = 0;  // in bytes
  if (residual.defined()) {
    sum = torch::empty(out.sizes(), residual.options());
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, residual.scalar_type(), "Residual",
                                    [&] { residual_row = &ResidualRow<scalar_t>; });
    rp = static_cast<const char*>(residual.const_data_ptr());
    sp = static_cast<char*>(sum.mutable_data_ptr());
    rstride = residual.stride(0) * residual.element_size();
    sstride = d * sum.element_size();
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "AddRouted", [&] {
    const scalar_t* yp = y.const_data_ptr<scalar_t>();
    const float* wp = r.weights.const_data_ptr<float>();
    float* op = out.mutable_data_ptr<float>();
    // Each thread owns its tokens' rows of out (and of the sum): no two write one row.
    at::parallel_for(0, out.size(0), RowGrain(d * k), [&](int64_t t0, int64_t t1) {
      std::vector<float> buf(d);
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t j = 0; j < k; ++j) {
          const int64_t p = r.places[t * k + j];
          AxpyRow(op + t * d, wp[p], AsFloats(yp + p * sy, buf.data(), d), d);
        }
        if (residual_row != nullptr) {
          residual_row(rp + t * rstride, op + t * d, sp + t * sstride, d, buf.data());
        }
      }
    });
  });
  return sum;
}

torch::Tensor RouterLogits(const torch::Tensor& x_in, const torch::Tensor& router_in) {
  TORCH_CHECK(!x_in.is_cuda() && x_in.dim() == 2 && router_in.dim() == 2 &&
                  router_in.size(1) == x_in.size(1),
              "cpu::RouterLogits: expected CPU rows [N, dim] and router weights [E, dim]");
  RECORD_FUNCTION("praxis::router_logits", std::vector<c10::IValue>());
  const torch::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const torch::Tensor router = router_in.to(torch::kFloat32).contiguous();
  const int64_t n = x.size(0), d = x.size(1), e = router.size(0), sx = x.stride(0);
  torch::Tensor logits = torch::empty({n, e}, x.options().dtype(torch::kFloat32));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "Router", [&] {
    const scalar_t* src = x.data_ptr<scalar_t>();
    const float* rp = router.data_ptr<float>();
    float* lp = logits.data_ptr<float>();
    at::parallel_for(0, n, RowGrain(d * e), [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(d);
      for (int64_t r = r0; r < r1; ++r) {
        Load(src + r * sx, buf.data(), d);
        RouterRow(buf.data(), rp, d, e, lp + r * e);
      }
    });
  });
  return logits;
}

ExpertRoutes RouteTopK(const torch::Tensor& logits_in, const torch::Tensor& bias_in, int64_t top_k,
                       double routed_scale) {
  TORCH_CHECK(!logits_in.is_cuda() && logits_in.dim() == 2 &&
                  logits_in.scalar_type() == torch::kFloat32 &&
                  bias_in.scalar_type() == torch::kFloat32 &&
                  bias_in.numel() == logits_in.size(1) && top_k >= 1 && top_k <= logits_in.size(1),
              "cpu::RouteTopK: expected float32 logits [N, E], float32 bias [E], 1 <= top_k <= E");
  RECORD_FUNCTION("praxis::route_top_k", std::vector<c10::IValue>());
  const torch::Tensor logits = logits_in.contiguous();
  const torch::Tensor bias = bias_in.contiguous();
  const int64_t n = logits.size(0), e = logits.size(1), pairs = n * top_k;
  const float* bp = bias.data_ptr<float>();
  std::vector<float> scores(n * e);
  SigmoidRow(logits.data_ptr<float>(), scores.data(), n * e);
  // Each token's chosen experts and weights in slot order, and the pairs per expert.
  std::vector<int32_t> chosen(pairs);
  std::vector<float> weight(pairs);
  // Tokens are routed independently (threads write their own tokens' slots), then counted.
  at::parallel_for(0, n, RowGrain(e * top_k), [&](int64_t t0, int64_t t1) {
    std::vector<bool> taken(e);
    for (int64_t t = t0; t < t1; ++t) {
      const float* s = scores.data() + t * e;
      std::fill(taken.begin(), taken.end(), false);
      float sum = 0;
      for (int64_t k = 0; k < top_k; ++k) {
        int64_t best = -1;  // ties go to the lower expert
        for (int64_t x = 0; x < e; ++x) {
          if (!taken[x] && (best < 0 || RanksAbove(s[x] + bp[x], s[best] + bp[best]))) best = x;
        }
        taken[best] = true;
        chosen[t * top_k + k] = static_cast<int32_t>(best);
        weight[t * top_k + k] = s[best];
        sum += s[best];
      }
      for (int64_t k = 0; k < top_k; ++k) {
        weight[t * top_k + k] = weight[t * top_k + k] / sum * static_cast<float>(routed_scale);
      }
    }
  });
  ExpertRoutes r;
  r.counts.assign(e, 0);
  for (int32_t x : chosen) ++r.counts[x];
  // A stable counting sort of the pairs by expert: each expert's slice in (token, slot) order.
  std::vector<int64_t> next(e, 0);
  for (int64_t x = 1; x < e; ++x) next[x] = next[x - 1] + r.counts[x - 1];
  r.tokens = torch::empty({pairs}, torch::kInt64);
  r.weights = torch::empty({pairs}, torch::kFloat32);
  int64_t* tp = r.tokens.data_ptr<int64_t>();
  float* wp = r.weights.data_ptr<float>();
  r.top_k = top_k;
  r.places.resize(pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t at = next[chosen[p]]++;
    tp[at] = p / top_k;
    wp[at] = weight[p];
    r.places[p] = at;
  }
  // Each token's places in expert order (its slots hold its experts in rank order).
  for (int64_t t = 0; t < n; ++t) {
    std::sort(r.places.begin() + t * top_k, r.places.begin() + (t + 1) * top_k);
  }
  return r;
}

int64_t AttentionTiles::nbytes() const {
  return static_cast<int64_t>((rows.size() + first.size()) * sizeof(int64_t) +
                              segments.size() * sizeof(Segment) + masks.size());
}

namespace {

// The longest segment's padded length: the row of scores (and probabilities) any segment needs.
int64_t WidestSegment(const AttentionTiles& tiles) {
  int64_t widest = 0;
  for (const AttentionTiles::Segment& seg : tiles.segments) {
    widest = std::max(widest, PadToLanes(seg.length));
  }
  return widest;
}

// TileAttention's unit of work: `rows` query rows from row0 of head hi in query tile `tile` of
// batch row bi, a tile's rows taken per_task at a time (rows <= 0 where a shorter tile has no
// such block). Consecutive tasks are the blocks of one tile, then the tiles of one head.
struct RowTask {
  int64_t bi, hi, tile, row0, rows;
};

int64_t RowTaskCount(const AttentionTiles& tiles, int64_t b, int64_t h, int64_t per_task) {
  const int64_t q_tiles = static_cast<int64_t>(tiles.first.size()) - 1;
  return b * h * q_tiles * ((tiles.block + per_task - 1) / per_task);
}

RowTask RowTaskAt(int64_t task, const AttentionTiles& tiles, int64_t h, int64_t per_task) {
  const int64_t q_tiles = static_cast<int64_t>(tiles.first.size()) - 1;
  const int64_t parts = (tiles.block + per_task - 1) / per_task;
  RowTask r;
  r.tile = task / parts % q_tiles;
  r.hi = task / (parts * q_tiles) % h;
  r.bi = task / (parts * q_tiles * h);
  r.row0 = tiles.rows[r.tile] + task % parts * per_task;
  r.rows = std::min(per_task, tiles.rows[r.tile + 1] - r.row0);
  return r;
}

// Segment `seg`'s mask row (every query row of its tile shares it), or null where the segment
// allows every pair.
const uint8_t* SegmentMask(const AttentionTiles& tiles, const AttentionTiles::Segment& seg) {
  return seg.mask_at < 0 ? nullptr : tiles.masks.data() + seg.mask_at;
}

// Checks that a gate's bias, where given, is float32 [heads] contiguous beside defined logits.
void CheckGateBias(const torch::Tensor& gate, const torch::Tensor& bias, int64_t heads,
                   const char* who) {
  TORCH_CHECK(!bias.defined() || (gate.defined() && bias.dim() == 1 && bias.size(0) == heads &&
                                  bias.scalar_type() == torch::kFloat32 && bias.is_contiguous()),
              who, ": expected the gate bias float32 [H], contiguous, beside gate logits");
}

// Head `head`'s gate from its logit and the gate's float32 bias (or null), as GateHeads and
// TileAttention's gated stores take it.
inline float GateOf(float logit, const float* bias, int64_t head) {
  if (bias != nullptr) logit += bias[head];
  return 1.0f / (1.0f + std::exp(-logit));
}

// Where TileAttention stores a row of output: [B, H, T, hd], or with gate logits [B, T, H] (any
// strides) and their per-head bias (float32 [H], or none) GateHeads's [B, T, H·hd], the row times
// its gate's sigmoid (one pass less over the heads than gating them after).
template <typename T>
struct HeadsOut {
  T* out;
  int64_t h, t, hd;
  const T* gate;      // or null
  const float* bias;  // or null
  int64_t gb, gt, gh;

  // `o` from HeadsOutTensor(q, g).
  HeadsOut(const torch::Tensor& o, const torch::Tensor& q, const torch::Tensor& g,
           const torch::Tensor& gate_bias)
      : out(o.data_ptr<T>()),
        h(q.size(1)),
        t(q.size(2)),
        hd(q.size(3)),
        gate(g.defined() ? g.data_ptr<T>() : nullptr),
        bias(gate_bias.defined() ? gate_bias.data_ptr<float>() : nullptr),
        gb(g.defined() ? g.stride(0) : 0),
        gt(g.defined() ? g.stride(1) : 0),
        gh(g.defined() ? g.stride(2) : 0) {}

  // Row ti of head hi of batch row bi: where it goes, and *norm times its gate.
  T* Row(int64_t bi, int64_t hi, int64_t ti, float* norm) const {
    if (gate == nullptr) return out + ((bi * h + hi) * t + ti) * hd;
    *norm *= GateOf(static_cast<float>(gate[bi * gb + ti * gt + hi * gh]), bias, hi);
    return out + ((bi * t + ti) * h + hi) * hd;
  }
};

// TileAttention's output tensor: [B, H, T, hd], or [B, T, H·hd] with a gate.
torch::Tensor HeadsOutTensor(const torch::Tensor& q, const torch::Tensor& gate) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), hd = q.size(3);
  return gate.defined() ? torch::empty({b, t, h * hd}, q.options())
                        : torch::empty({b, h, t, hd}, q.options());
}

#if defined(PRAXIS_X86_SIMD)
// PackVnni's block of 16 keys from n0 (kh, vh: one head's keys and values, rows ks and vs apart;
// kd, vd: its packed copies): each word row of the keys gathered across the 16 keys,
// each pair of value rows widened and interleaved 16 columns at a time. The scalar loop it
// replaces was 1.5 % of a bench small bf16 B1 step's samples (perf). The gather's indices (within
// 16 keys) fit an int32 (PackVnni checks).
__attribute__((target("avx512f,avx512vl,avx512bw"))) void PackVnniBlockAvx512(
    const uint16_t* kh, int64_t ks, const uint16_t* vh, int64_t vs, int64_t kv_len, int64_t hd,
    int64_t ldk, int64_t n0, int32_t* kd, int32_t* vd) {
  const __mmask16 keys = LanesLeft(std::max<int64_t>(kv_len - n0, 0));
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int32_t>(ks)));
  const uint16_t* block = kh + n0 * ks;
  for (int64_t i = 0; i < hd / 2; ++i) {
    const __m512i at = _mm512_add_epi32(rows, _mm512_set1_epi32(static_cast<int32_t>(2 * i)));
    _mm512_storeu_si512(kd + i * ldk + n0,
                        _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), keys, at, block, 2));
  }
  for (int64_t j = n0 / 2; j < (n0 + kLanes) / 2; ++j) {
    int32_t* dst = vd + j * hd;
    const uint16_t* first = vh + 2 * j * vs;
    // The last key of an odd count pairs with zero; past the keys both are zero.
    const bool has_first = 2 * j < kv_len, has_second = 2 * j + 1 < kv_len;
    for (int64_t c = 0; c < hd; c += kLanes) {
      const __mmask16 m = LanesLeft(hd - c);
      const __mmask16 m1 = has_first ? m : 0, m2 = has_second ? m : 0;
      const __m512i lo = _mm512_maskz_cvtepu16_epi32(m1, _mm256_maskz_loadu_epi16(m1, first + c));
      const __m512i hi =
          _mm512_maskz_cvtepu16_epi32(m2, _mm256_maskz_loadu_epi16(m2, first + vs + c));
      _mm512_mask_storeu_epi32(dst + c, m, _mm512_or_si512(lo, _mm512_maskz_slli_epi32(m, hi, 16)));
    }
  }
}

// k and v [B, kvH, kv_len, hd] (bf16, any strides with the last 1) as brgemm's B operands in the
// VNNI layout (two consecutive rows of the product's inner dimension interleaved, one 32-bit word
// per pair), zero past the keys up to ldk (even): a segment's padded columns then score 0 (its
// mask removes them) and its padded keys carry no value. Keys, B of q·kᵀ: kp [B, kvH, hd/2, ldk]
// words, k's rows read as words and transposed. Values, B of p·v: vp [B, kvH, ldk/2, hd] words,
// rows 2j and 2j + 1 interleaved. One pass over each, in blocks of 16 keys (a cache line of kp).
void PackVnni(const torch::Tensor& k, const torch::Tensor& v, int64_t ldk, int32_t* kp,
              int32_t* vp) {
  const int64_t b = k.size(0), kvh = k.size(1), kv_len = k.size(2), hd = k.size(3);
  const int64_t words = hd / 2, blocks = ldk / kLanes;
  const auto* kb = reinterpret_cast<const uint16_t*>(k.data_ptr<at::BFloat16>());
  const auto* vb = reinterpret_cast<const uint16_t*>(v.data_ptr<at::BFloat16>());
  TORCH_CHECK(HasAvx512Bf16Convert() && kLanes * k.stride(2) + hd < INT32_MAX,
              "cpu::PackVnni: needs AVX-512 BW and VL, and key rows under 2^27 elements apart");
  at::parallel_for(0, b * kvh * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t head = task / blocks, n0 = task % blocks * kLanes;
      const int64_t bi = head / kvh, hi = head % kvh;
      PackVnniBlockAvx512(kb + bi * k.stride(0) + hi * k.stride(1), k.stride(2),
                          vb + bi * v.stride(0) + hi * v.stride(1), v.stride(2), kv_len, hd, ldk,
                          n0, kp + head * words * ldk, vp + head * (ldk / 2) * hd);
    }
  });
}

// Whether LibTorch's brgemm computes one small bf16 product exactly as TileAttentionBf16Brgemm
// calls it for p·v, B packed by PackVnni: small integers, so every sum is exact in float32.
// LibTorch's could_pack() is no guide: it is false on Zen 4, whose brgemm still takes VNNI-packed
// bf16 (stop 46).
bool Bf16BrgemmComputesVnni() {
  constexpr int64_t kM = 16, kN = 16, kK = 32;
  const torch::Tensor a = (torch::arange(kM).unsqueeze(1) + 2 * torch::arange(kK))
                              .remainder(5)
                              .sub(2)
                              .to(at::kBFloat16);
  const torch::Tensor b = (3 * torch::arange(kK).unsqueeze(1) + torch::arange(kN))
                              .remainder(7)
                              .sub(3)
                              .to(at::kBFloat16);
  const int64_t ldk = PadToLanes(kK) + kLanes;
  std::vector<int32_t> kp(kN / 2 * ldk), vp(ldk / 2 * kN);
  const torch::Tensor bv = b.view({1, 1, kK, kN});
  PackVnni(bv, bv, ldk, kp.data(), vp.data());
  const torch::Tensor c = torch::empty({kM, kN});
  try {
    at::native::cpublas::brgemm(kM, kN, kK, kK, kN, kN, /*add_C=*/false, a.data_ptr<at::BFloat16>(),
                                reinterpret_cast<const at::BFloat16*>(vp.data()),
                                c.data_ptr<float>());
    at::native::cpublas::brgemm_release();
  } catch (const std::exception&) {
    return false;
  }
  return torch::equal(c, torch::matmul(a.to(torch::kFloat32), b.to(torch::kFloat32)));
}

// TileAttention in bf16 with both products on oneDNN's brgemm (bf16 in, float32 out; AMX tiles or
// AVX512-BF16 dot products) and the online softmax between them in AVX-512, as TileAttention's
// float32 path: per task of kBrgemmRows query rows and per key segment, s = q·kᵀ, p = softmax step
// (rounded to bf16), acc = acc·alpha + p·v. Shapes checked by TileAttention; hd and every
// segment's start are even.
torch::Tensor TileAttentionBf16Brgemm(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, const AttentionTiles& tiles,
                                      double scale, const torch::Tensor& gate,
                                      const torch::Tensor& gate_bias) {
  using at::native::cpublas::brgemm;
  const int64_t b = q.size(0), h = q.size(1), hd = q.size(3);
  const int64_t kvh = k.size(1), group = h / kvh, kv_len = tiles.kv_len;
  const int64_t ldk = PadToLanes(kv_len) + kLanes;
  const torch::Tensor kp = torch::empty({b, kvh, hd / 2, ldk}, torch::kInt32);
  const torch::Tensor vp = torch::empty({b, kvh, ldk / 2, hd}, torch::kInt32);
  // The pack reads rows with a unit last stride (TileAttention asks that of q only).
  PackVnni(k.stride(3) == 1 ? k : k.contiguous(), v.stride(3) == 1 ? v : v.contiguous(), ldk,
           kp.data_ptr<int32_t>(), vp.data_ptr<int32_t>());
  torch::Tensor out = HeadsOutTensor(q, gate);
  const HeadsOut<at::BFloat16> sink(out, q, gate, gate_bias);
  const int64_t widest = WidestSegment(tiles);
  const int64_t tasks = RowTaskCount(tiles, b, h, kBrgemmRows);
  const int64_t sb = q.stride(0), sh = q.stride(1), st = q.stride(2);
  const auto* qp = q.data_ptr<at::BFloat16>();
  const auto* kpp = reinterpret_cast<const at::BFloat16*>(kp.data_ptr<int32_t>());
  const auto* vpp = reinterpret_cast<const at::BFloat16*>(vp.data_ptr());
  const float factor = static_cast<float>(scale);
  at::parallel_for(0, tasks, 1, [&](int64_t task0, int64_t task1) {
    // Scores, probabilities and sums, each written before it is read: left uninitialized (zeroing
    // them, up to 220 KB per thread and call, was a memset of its own in the profile).
    const auto s = std::make_unique_for_overwrite<float[]>(kBrgemmRows * widest);
    const auto acc = std::make_unique_for_overwrite<float[]>(kBrgemmRows * hd);
    const auto p = std::make_unique_for_overwrite<at::BFloat16[]>(kBrgemmRows * widest);
    std::vector<float> m(kBrgemmRows), l(kBrgemmRows);
    for (int64_t task = task0; task < task1; ++task) {
      const RowTask rt = RowTaskAt(task, tiles, h, kBrgemmRows);
      const int64_t bi = rt.bi, hi = rt.hi, tile = rt.tile, row0 = rt.row0, rows = rt.rows;
      if (rows <= 0) continue;
      const int64_t kv = bi * kvh + hi / group;
      const at::BFloat16* qrows = qp + bi * sb + hi * sh + row0 * st;
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      bool first = true;
      for (int64_t e = tiles.first[tile]; e < tiles.first[tile + 1]; ++e) {
        const AttentionTiles::Segment& seg = tiles.segments[e];
        const int64_t padded = PadToLanes(seg.length);
        const uint8_t* mask = SegmentMask(tiles, seg);
        brgemm(rows, padded, hd, st, ldk, widest, /*add_C=*/false, qrows,
               kpp + kv * hd * ldk + seg.start * 2, s.get());
        for (int64_t r = 0; r < rows; ++r) {
          float* sr = s.get() + r * widest;
          const float alpha =
              SoftmaxRowToBf16(sr, padded, mask, factor, &m[r], &l[r], p.get() + r * widest);
          if (!first && alpha != 1.0f) ScaleBy(acc.get() + r * hd, alpha, hd);
        }
        brgemm(rows, hd, padded, widest, hd, hd, /*add_C=*/!first, p.get(),
               vpp + kv * ldk * hd + seg.start * hd, acc.get());
        first = false;
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* ar = acc.get() + r * hd;
        if (first) std::fill(ar, ar + hd, 0.0f);  // the tile attends no key
        float norm = l[r] > 0 ? 1.0f / l[r] : 0.0f;
        at::BFloat16* dst = sink.Row(bi, hi, row0 + r, &norm);  // may fold the gate into norm
        StoreScaled(ar, norm, dst, hd);
      }
    }
    // Give the tile configuration back: LibTorch's kernels assume theirs is still loaded.
    at::native::cpublas::brgemm_release();
  });
  return out;
}
#endif

// Whether TileAttention (kBest) runs heads of `dtype` and `hd` on the bf16 brgemm.
bool TakesBf16Brgemm(torch::ScalarType dtype, int64_t hd) {
  return dtype == at::kBFloat16 && hd >= kBf16BrgemmMinHeadDim && hd % 2 == 0 && HasBf16Brgemm();
}

}  // namespace

bool HasBf16Brgemm() {
#if defined(PRAXIS_X86_SIMD)
  // oneDNN runs bf16 brgemm on AMX-BF16 or AVX512-BF16 (and emulates it on other CPUs: not taken).
  static const bool has = [] {
    const char* const env = std::getenv("PRAXIS_BF16_BRGEMM");
    if (env != nullptr && std::atoi(env) == 0) return false;
    // PackVnni, which the check runs, needs AVX-512 BW and VL besides (every AVX512-BF16 CPU).
    return HasAvx512Bf16Convert() && Bf16BrgemmComputesVnni();
  }();
  return has;
#else
  return false;
#endif
}

int64_t TileAttentionRows(torch::ScalarType dtype, int64_t head_dim) {
  return TakesBf16Brgemm(dtype, head_dim) ? kBrgemmRows : kAttentionRows;
}

torch::Tensor TileAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const AttentionTiles& tiles, double scale, AttentionIsa isa,
                            const torch::Tensor& gate, const torch::Tensor& gate_bias) {
  const int64_t b = q.size(0), h = q.size(1), t = q.size(2), hd = q.size(3);
  TORCH_CHECK(!q.is_cuda() && q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes() &&
                  k.size(0) == b && k.size(3) == hd && k.size(1) > 0 && h % k.size(1) == 0 &&
                  q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                  q.stride(3) == 1 && scale > 0,
              "cpu::TileAttention: expected CPU q [B, H, T, hd] and k, v [B, kvH, T, hd] of one "
              "dtype, kvH dividing H, q's last stride 1, and a positive scale");
  // Tiles that cover the rows in order, none longer than `block`: every output row is written.
  const auto misplaced = [&](int64_t a, int64_t z) { return z < a || z - a > tiles.block; };
  TORCH_CHECK(
      t == tiles.q_len && k.size(2) == tiles.kv_len && tiles.block > 0 &&
          tiles.rows.size() == tiles.first.size() && tiles.rows.size() >= 2 &&
          tiles.rows.front() == 0 && tiles.rows.back() == t &&
          std::adjacent_find(tiles.rows.begin(), tiles.rows.end(), misplaced) == tiles.rows.end(),
      "cpu::TileAttention: tiles of another layout");
  TORCH_CHECK(!gate.defined() || (gate.dim() == 3 && gate.size(0) == b && gate.size(1) == t &&
                                  gate.size(2) == h && gate.scalar_type() == q.scalar_type()),
              "cpu::TileAttention: expected gate logits [B, T, H] of q's dtype");
  CheckGateBias(gate, gate_bias, h, "cpu::TileAttention");
  RECORD_FUNCTION("praxis::tile_attention", std::vector<c10::IValue>());
#if defined(PRAXIS_X86_SIMD)
  if (isa == AttentionIsa::kBest && TakesBf16Brgemm(q.scalar_type(), hd) &&
      std::all_of(tiles.segments.begin(), tiles.segments.end(),
                  [](const AttentionTiles::Segment& seg) { return seg.start % 2 == 0; })) {
    return TileAttentionBf16Brgemm(q, k, v, tiles, scale, gate, gate_bias);
  }
#endif
  const int64_t kvh = k.size(1), group = h / kvh, kv_len = tiles.kv_len;
  // A segment starts anywhere (a key run need not start at a multiple of kLanes): its padded
  // score row reads up to kLanes - 1 columns past the keys, kept in bounds by kLanes columns of
  // zeros.
  const int64_t ldk = PadToLanes(kv_len) + kLanes, hdp = PadToLanes(hd);
  static_assert(AttentionTiles::kMaskAlign == kLanes);
  // Keys transposed [B, kvH, hd, ldk] and values [B, kvH, kv_len, hdp], float32, zero-padded: the
  // scores of a tile are rows of kLanes-wide dot products, its values rows of kLanes chunks.
  // Only the padding is zeroed (zeroing both whole first: 0.1-0.4 ms of a bench small B8 step).
  torch::Tensor kt = torch::empty({b, kvh, hd, ldk}, torch::kFloat32);
  kt.narrow(3, kv_len, ldk - kv_len).zero_();
  kt.narrow(3, 0, kv_len).copy_(k.transpose(2, 3));
  // Float32 values of a lane-multiple head width are read where they lie (a strided view of the
  // stacked projection), their rows `ldv` apart.
  torch::Tensor vf = v;
  if (hdp != hd || v.scalar_type() != torch::kFloat32 || v.stride(3) != 1) {
    vf = hdp == hd ? torch::empty({b, kvh, kv_len, hdp}, torch::kFloat32)
                   : torch::zeros({b, kvh, kv_len, hdp}, torch::kFloat32);
    vf.narrow(3, 0, hd).copy_(v);
  }
  const int64_t ldv = vf.stride(2), svb = vf.stride(0), svh = vf.stride(1);
  torch::Tensor out = HeadsOutTensor(q, gate);
  const int64_t widest = WidestSegment(tiles);
  const int64_t tasks = RowTaskCount(tiles, b, h, kAttentionRows);
  const int64_t sb = q.stride(0), sh = q.stride(1), st = q.stride(2);
  const float* ktp = kt.data_ptr<float>();
  const float* vfp = vf.data_ptr<float>();
  const bool avx512 = UseAvx512(isa);
  const float factor = static_cast<float>(scale);
#if defined(PRAXIS_X86_SIMD)
  const auto product = avx512 ? BlockProductAvx512 : BlockProductPortable;
  const auto softmax = avx512 ? SoftmaxRowAvx512 : SoftmaxRowPortable;
#else
  const auto product = BlockProductPortable;
  const auto softmax = SoftmaxRowPortable;
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "TileAttention", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const HeadsOut<scalar_t> sink(out, q, gate, gate_bias);
    at::parallel_for(0, tasks, 1, [&](int64_t task0, int64_t task1) {
      std::vector<float> qf(kAttentionRows * hd), s(kBlockRows * widest), p(kBlockRows * widest),
          acc(kAttentionRows * hdp), m(kAttentionRows), l(kAttentionRows), alpha(kBlockRows);
      for (int64_t task = task0; task < task1; ++task) {
        const RowTask rt = RowTaskAt(task, tiles, h, kAttentionRows);
        const int64_t bi = rt.bi, hi = rt.hi, tile = rt.tile, row0 = rt.row0, rows = rt.rows;
        if (rows <= 0) continue;
        const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
        const float* kth = ktp + (bi * kvh + hi / group) * hd * ldk;
        const float* vh = vfp + bi * svb + hi / group * svh;
        // Rows past `rows` score 0 against every key: finite, and never stored.
        std::fill(qf.begin(), qf.end(), 0.0f);
        for (int64_t r = 0; r < rows; ++r) {
          Load(qp + bi * sb + hi * sh + (row0 + r) * st, qf.data() + r * hd, hd);
        }
        std::fill(m.begin(), m.end(), kNegInf);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t e = tiles.first[tile]; e < tiles.first[tile + 1]; ++e) {
          const AttentionTiles::Segment& seg = tiles.segments[e];
          const int64_t padded = PadToLanes(seg.length);
          // One mask row for the tile's rows; padded == its length (kMaskAlign == kLanes).
          const uint8_t* mask = SegmentMask(tiles, seg);
          for (int64_t bk = 0; bk < blocks; ++bk) {
            const int64_t r0 = bk * kBlockRows;
            product(qf.data() + r0 * hd, hd, kth + seg.start, ldk, hd, padded, s.data(), padded,
                    nullptr);
            for (int64_t r = 0; r < kBlockRows; ++r) {
              alpha[r] = softmax(s.data() + r * padded, padded, mask, factor, &m[r0 + r],
                                 &l[r0 + r], p.data() + r * padded);
            }
            product(p.data(), padded, vh + seg.start * ldv, ldv, seg.length, hdp,
                    acc.data() + r0 * hdp, hdp, alpha.data());
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          float* ar = acc.data() + r * hdp;
          float norm = l[r] > 0 ? 1.0f / l[r] : 0.0f;
          scalar_t* dst = sink.Row(bi, hi, row0 + r, &norm);
          StoreScaled(ar, norm, dst, hd);
        }
      }
    });
  });
  return out;
}

torch::Tensor GateHeads(const torch::Tensor& o, const torch::Tensor& gate,
                        const torch::Tensor& gate_bias) {
  TORCH_CHECK(!o.is_cuda() && o.dim() == 4 && o.stride(3) == 1 && gate.dim() == 3 &&
                  gate.size(0) == o.size(0) && gate.size(1) == o.size(2) &&
                  gate.size(2) == o.size(1) && gate.scalar_type() == o.scalar_type(),
              "cpu::GateHeads: expected CPU heads [B, H, T, hd] with unit last stride and gate "
              "logits [B, T, H] of their dtype");
  CheckGateBias(gate, gate_bias, o.size(1), "cpu::GateHeads");
  RECORD_FUNCTION("praxis::gate_heads", std::vector<c10::IValue>());
  const int64_t b = o.size(0), h = o.size(1), t = o.size(2), hd = o.size(3);
  // The gate logits are read where they lie (a strided slice of the stacked projection) and their
  // sigmoid taken in float32 per (token, head): converting the slice first cost a gathering copy.
  torch::Tensor y = torch::empty({b, t, h * hd}, o.options());
  const int64_t sb = o.stride(0), sh = o.stride(1), st = o.stride(2);
  const int64_t gb = gate.stride(0), gt = gate.stride(1), gh = gate.stride(2);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, o.scalar_type(), "GateHeads", [&] {
    const scalar_t* src = o.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    const scalar_t* gp = gate.data_ptr<scalar_t>();
    const float* bias = gate_bias.defined() ? gate_bias.data_ptr<float>() : nullptr;
    at::parallel_for(0, b * t, RowGrain(h * hd), [&](int64_t a, int64_t e) {
      std::vector<float> buf(hd);
      for (int64_t bt = a; bt < e; ++bt) {
        const int64_t bi = bt / t, ti = bt % t;
        for (int64_t hi = 0; hi < h; ++hi) {
          const float g = GateOf(static_cast<float>(gp[bi * gb + ti * gt + hi * gh]), bias, hi);
          Load(src + bi * sb + hi * sh + ti * st, buf.data(), hd);
          ScaleBy(buf.data(), g, hd);
          Store(buf.data(), dst + (bt * h + hi) * hd, hd);
        }
      }
    });
  });
  return y;
}

namespace {

// The forms a weight is copied into for a faster GEMM: float32 (MatmulViaFloat32's, for CPUs
// whose 16-bit GEMM is the slower), or a bf16 [..., K, N] weight packed for oneDNN's brgemm (the
// VNNI layout, [..., K/2, N, 2]: ExpertPieceInto's bf16 pieces, PackForBrgemm).
enum class CopyForm : int8_t { kFloat32, kBrgemm };

// w [..., K, N] (bf16, any strides, K even) as brgemm's B operands: rows 2i and 2i + 1
// interleaved. Always a new tensor (a view of w would keep w's storage alive from the cache).
torch::Tensor PackedForBrgemm(const torch::Tensor& w) {
  std::vector<int64_t> pairs(w.sizes().begin(), w.sizes().end() - 2);
  pairs.insert(pairs.end(), {w.size(-2) / 2, 2, w.size(-1)});
  return w.reshape(pairs).transpose(-1, -2).clone(at::MemoryFormat::Contiguous);
}

// Copies of weights in a CopyForm, by the view they were made from (its storage, offset, sizes
// and strides: an expert's slice of the stacked weights is its own entry) and the form. A copy
// lives while its weight's storage does; one whose storage died (its model unloaded) is dropped
// at the next new copy. The weak reference keeps the storage's control block, so its address is
// never reused while the entry exists. All forms count against one budget. Thread-safe.
class WeightCopies {
 public:
  // w's copy in `form`; undefined when it would not fit in the budget.
  torch::Tensor Of(const torch::Tensor& w, CopyForm form = CopyForm::kFloat32) {
    absl::MutexLock lock(&mu_);
    if (!MakeAllLocked({w}, form)) return {};
    return *FindLocked(w, form);
  }

  // Copies of every weight in `ws` in `form`, made where missing, all or none: false, nothing
  // made, when the missing ones would not fit in the budget together.
  bool MakeAll(const std::vector<torch::Tensor>& ws, CopyForm form) {
    absl::MutexLock lock(&mu_);
    return MakeAllLocked(ws, form);
  }

  // w's copy in `form` where one was made (and its weight lives); undefined otherwise. With
  // `transposed`, the copy made of w's transpose over its last two dimensions, found without
  // making that view (an op's dispatch, on every bf16 Linear and piece of a step).
  torch::Tensor Find(const torch::Tensor& w, CopyForm form, bool transposed = false) {
    absl::MutexLock lock(&mu_);
    const torch::Tensor* copy = FindLocked(w, form, transposed);
    return copy == nullptr ? torch::Tensor() : *copy;
  }

  void SetBudget(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    budget_ = bytes;
  }

  // Counts `bytes` of float32 weights held elsewhere against the budget; false (nothing counted)
  // when they do not fit beside the copies and the other holds.
  bool Hold(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    DropExpired();
    if (held_ + bytes > budget_) return false;
    held_ += bytes;
    return true;
  }
  void Release(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    held_ -= bytes;
  }

  static WeightCopies& Get() {
    static WeightCopies* const copies = new WeightCopies();  // never destroyed: outlives models
    return *copies;
  }

 private:
  // MakeAll under the lock. A call whose copies all exist (MatmulViaFloat32's every call after
  // its first) only looks them up: no pass over the entries for expired ones.
  bool MakeAllLocked(const std::vector<torch::Tensor>& ws, CopyForm form)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t bytes = 0;
    bool missing = false;
    for (const torch::Tensor& w : ws) {
      if (FindLocked(w, form) != nullptr) continue;
      bytes += BytesOf(w, form);
      missing = true;
    }
    if (!missing) return true;
    DropExpired();
    if (held_ + bytes > budget_) return false;
    for (const torch::Tensor& w : ws) {
      if (FindLocked(w, form) != nullptr) continue;
      torch::Tensor copy = form == CopyForm::kFloat32 ? w.to(torch::kFloat32) : PackedForBrgemm(w);
      held_ += copy.nbytes();
      copies_.insert_or_assign(KeyOf(w, form), Entry{w.storage().getWeakStorageImpl(), copy});
    }
    return true;
  }

  // The bytes of w's copy in `form`.
  static int64_t BytesOf(const torch::Tensor& w, CopyForm form) {
    return w.numel() * (form == CopyForm::kFloat32 ? static_cast<int64_t>(sizeof(float))
                                                   : static_cast<int64_t>(w.element_size()));
  }

  const torch::Tensor* FindLocked(const torch::Tensor& w, CopyForm form, bool transposed = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = copies_.find(KeyOf(w, form, transposed));
    return it == copies_.end() || it->second.storage.expired() ? nullptr : &it->second.copy;
  }

  // Forgets the copies whose weight is gone (its model unloaded), giving back their bytes.
  void DropExpired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::erase_if(copies_, [this](const auto& entry) {
      if (!entry.second.storage.expired()) return false;
      held_ -= entry.second.copy.nbytes();
      return true;
    });
  }

  // Sizes and strides inline: a lookup (every bf16 Linear and piece, every step) allocates
  // nothing.
  using Dims = absl::InlinedVector<int64_t, 4>;
  using Key = std::tuple<const void*, int64_t, Dims, Dims, CopyForm>;
  // With `transposed`, the key of w.transpose(-1, -2).
  static Key KeyOf(const torch::Tensor& w, CopyForm form, bool transposed = false) {
    Dims sizes(w.sizes().begin(), w.sizes().end()), strides(w.strides().begin(), w.strides().end());
    if (transposed && w.dim() >= 2) {
      std::swap(sizes[sizes.size() - 1], sizes[sizes.size() - 2]);
      std::swap(strides[strides.size() - 1], strides[strides.size() - 2]);
    }
    return {w.storage().unsafeGetStorageImpl(), w.storage_offset(), std::move(sizes),
            std::move(strides), form};
  }
  struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    torch::Tensor copy;
  };
  absl::Mutex mu_;
  std::map<Key, Entry> copies_ ABSL_GUARDED_BY(mu_);
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of the copies in copies_, and of the holds
  int64_t budget_ ABSL_GUARDED_BY(mu_) = int64_t{1} << 30;
};

}  // namespace

torch::Tensor MatmulViaFloat32(const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, std::optional<torch::ScalarType> out) {
  TORCH_CHECK(w.dim() == 2 && x.size(-1) == w.size(0), "MatmulViaFloat32: x ", x.sizes(),
              " against w ", w.sizes());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(1);
  const torch::Tensor w32 = WeightCopies::Get().Of(w);
  const torch::Tensor b32 = b.defined() && w32.defined() ? WeightCopies::Get().Of(b) : b;
  const bool fits = w32.defined() && (!b.defined() || b32.defined());
  if (!fits) {  // over the budget: LibTorch's GEMM in w's dtype
    const torch::Tensor xd = x.reshape({-1, x.size(-1)}).to(w.scalar_type());
    return (b.defined() ? at::addmm(b, xd, w) : at::mm(xd, w))
        .to(out.value_or(w.scalar_type()))
        .view(shape);
  }
  const torch::Tensor x32 = x.reshape({-1, x.size(-1)}).to(torch::kFloat32);
  const torch::Tensor y = b.defined() ? at::addmm(b32, x32, w32) : at::mm(x32, w32);
  return y.to(out.value_or(w.scalar_type())).view(shape);
}

namespace {

// A symbol of libtorch_cpu itself (which the process links), not of whichever library loaded first
// exports the name: an ILP64 BLAS's sgemm_ would read our 32-bit ints as 64-bit ones. Null where
// that library (by its name) or the symbol is absent.
void* LibTorchCpuSymbol(const char* name) {
  void* lib = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) return nullptr;
  void* symbol = dlsym(lib, name);
  dlclose(lib);  // the reference RTLD_NOLOAD took; the library stays loaded
  return symbol;
}

// How a GEMM of ours addresses w [K, N]: row-major (ld = its row stride) or as wᵀ row-major
// (transposed, ld = its column stride: a Linear's [out, in] weight); nullopt where neither fits.
// One decision for the check and the call: with a size-1 dimension both strides may be 1, and only
// the layout whose leading dimension covers a row is right.
struct WeightLayout {
  bool transposed = false;
  int64_t ld = 0;
};
std::optional<WeightLayout> WeightLayoutOf(int64_t k, int64_t n, int64_t row_stride,
                                           int64_t col_stride) {
  if (col_stride == 1 && row_stride >= std::max<int64_t>(n, 1))
    return WeightLayout{false, row_stride};
  if (row_stride == 1 && col_stride >= std::max<int64_t>(k, 1))
    return WeightLayout{true, col_stride};
  return std::nullopt;
}

// The elements a GEMM call of ours reads: uint16_t for bf16 (oneDNN's brgemm), or float (brgemm,
// or LibTorch's float GEMM, MKL's sgemm in its x86 wheel).
template <typename T>
constexpr torch::ScalarType kBlasDtype =
    std::is_same_v<T, float> ? torch::kFloat32 : torch::kBFloat16;

// A CPU tensor of plain strided storage in T's dtype: what the BLAS call reads or writes.
template <typename T>
bool CpuBlasOperand(const torch::Tensor& t) {
  return t.is_cpu() && t.layout() == torch::kStrided && t.scalar_type() == kBlasDtype<T>;
}

template <typename T>
const T* BlasData(const torch::Tensor& t) {
  if constexpr (std::is_same_v<T, float>) {
    return t.const_data_ptr<float>();
  } else {
    return reinterpret_cast<const uint16_t*>(t.const_data_ptr<c10::BFloat16>());
  }
}

// A [K, N] weight operand as the BLAS call addresses it; a bf16 one on oneDNN's brgemm also has
// its packed copy (PackedForBrgemm's [K/2, N, 2], kept by WeightCopies).
template <typename T>
struct BlasWeight {
  const T* data;
  int64_t k, n;
  WeightLayout layout;
  const at::BFloat16* packed = nullptr;
  int64_t packed_ld = 0;  // the packed copy's columns ([K/2, N, 2]: its rows' pairs), brgemm's ldb
};

// Columns [first, first + count) of w: the same rows, of its packed copy as well.
template <typename T>
BlasWeight<T> ColumnsOf(BlasWeight<T> w, int64_t first, int64_t count) {
  w.data += w.layout.transposed ? first * w.layout.ld : first;
  if (w.packed != nullptr) w.packed += 2 * first;
  w.n = count;
  return w;
}

// Expert `expert` of a [E, K, N] stack, or the [K, N] weight itself (expert < 0), or with `linear`
// a Linear's [N, K] weight read as its transpose; nullopt where it is not T's of such a form.
template <typename T = uint16_t>
std::optional<BlasWeight<T>> BlasOperand(const torch::Tensor& w, int64_t expert,
                                         bool linear = false) {
  const int64_t d = w.dim();
  if (!CpuBlasOperand<T>(w) || d != (expert < 0 ? 2 : 3) || (expert >= 0 && expert >= w.size(0))) {
    return std::nullopt;
  }
  const int64_t rk = linear ? d - 1 : d - 2, rn = linear ? d - 2 : d - 1;
  const int64_t k = w.size(rk), n = w.size(rn);
  const std::optional<WeightLayout> wl = WeightLayoutOf(k, n, w.stride(rk), w.stride(rn));
  if (!wl.has_value() || std::max({k, n, wl->ld}) > INT_MAX) return std::nullopt;
  return BlasWeight<T>{BlasData<T>(w) + (expert < 0 ? 0 : expert * w.stride(0)), k, n, *wl};
}

}  // namespace

double BestSeconds(int runs, const std::function<void()>& run) {
  run();
  double best = INFINITY;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

namespace {

// The operands RECORD_FUNCTION reports for one product of GatedInto (built only while something
// records): views of the rows and of the weight.
template <typename T>
std::vector<c10::IValue> RecordedProduct(const T* a, int64_t m, int64_t lda,
                                         const BlasWeight<T>& w) {
  const auto options = torch::TensorOptions().dtype(kBlasDtype<T>);
  const int64_t ld = w.layout.ld;
  return {torch::from_blob(const_cast<T*>(a), {m, w.k}, {lda, 1}, options),
          torch::from_blob(
              const_cast<T*>(w.data), {w.k, w.n},
              w.layout.transposed ? std::vector<int64_t>{1, ld} : std::vector<int64_t>{ld, 1},
              options)};
}

// BLAS's float GEMM (Fortran, column-major, 32-bit ints), which LibTorch's x86 wheel carries in
// libtorch_cpu (MKL's) and exports, under LibTorch's own float matmul. Looked up at run time: where
// it is absent, float32 pieces stay on LibTorch's ops.
using BlasSgemm = void (*)(const char* trans_a, const char* trans_b, const int* m, const int* n,
                           const int* k, const float* alpha, const float* a, const int* lda,
                           const float* b, const int* ldb, const float* beta, float* c,
                           const int* ldc);

BlasSgemm FindBlasSgemm() {
  static const auto gemm = reinterpret_cast<BlasSgemm>(LibTorchCpuSymbol("sgemm_"));
  return gemm;
}

// Whether LibTorch's brgemm multiplies float32 here, checked on a small known product: small
// integers, so every sum is exact. (Where oneDNN's ukernel cannot, LibTorch's brgemm calls its
// float GEMM instead; where it throws, not taken.)
bool Float32BrgemmComputes() {
#if defined(PRAXIS_X86_SIMD)
  constexpr int64_t kM = 5, kN = 20, kK = 24;
  const torch::Tensor a =
      ((torch::arange(kM).unsqueeze(1) + 2 * torch::arange(kK)).remainder(5) - 2).to(at::kFloat);
  const torch::Tensor b =
      ((3 * torch::arange(kK).unsqueeze(1) + torch::arange(kN)).remainder(7) - 3).to(at::kFloat);
  const torch::Tensor c = torch::empty({kM, kN});
  try {
    at::native::cpublas::brgemm(kM, kN, kK, kK, kN, kN, /*add_C=*/false, a.const_data_ptr<float>(),
                                b.const_data_ptr<float>(), c.mutable_data_ptr<float>(),
                                /*is_vnni=*/false);
  } catch (const std::exception&) {
    return false;
  }
  return torch::equal(c, torch::matmul(a, b));
#else
  return false;
#endif
}

// The GEMM a piece of T's runs on, found: oneDNN's brgemm taking bf16, or BLAS's float one.
template <typename T>
bool HasPieceGemm() {
  if constexpr (std::is_same_v<T, float>) {
    return FindBlasSgemm() != nullptr;
  } else {
    return HasBf16Brgemm();
  }
}

// Rows of a bf16 piece's products per brgemm call (its A block and float32 C block stay in L2),
// and the multiple its rows are padded to: a piece of any row count then makes at most
// kPieceBrgemmRows / kPieceBrgemmRowStep kernels per weight shape in oneDNN's cache, not one per
// row count.
constexpr int64_t kPieceBrgemmRows = 32, kPieceBrgemmRowStep = 8;

// Bytes of a brgemm call's B block: a deeper product runs as calls over blocks of its depth, each
// summed into C, so that the block stays in L2 while the call's row blocks sweep it. In one call,
// a text's 32 tokens through the bench config's 2560-deep projection ran at ~35 GFLOP/s a core.
constexpr int64_t kBrgemmBlockBytes = 256 << 10;

// The depth of a brgemm call's B block over n columns of `bytes`-wide elements: a multiple of 64
// (VNNI pairs of bf16 rows), all of k where that fits.
int64_t BrgemmDepth(int64_t k, int64_t n, int64_t bytes) {
  return std::min(k, std::max<int64_t>(1, kBrgemmBlockBytes / (64 * n * bytes)) * 64);
}

// c [m, w.n] (float32, rows of ldc) = a [m, w.k] (rows of lda) · w on one thread, recorded as the
// op GemmRecord replays over the piece's own `rows` (m less its padding): bf16 on oneDNN's brgemm
// over w.packed (m a multiple of kPieceBrgemmRowStep); float32 on oneDNN's brgemm where w's rows
// are [K, N] (HasFloat32Brgemm; it reads no transposed B), else on BLAS's float GEMM
// (column-major: cᵀ = wᵀ·aᵀ). With `add_c`, the product is added onto c's rows (a bias there).
// Sizes known to fit an int.
void GatedProduct(const uint16_t* a, int64_t m, int64_t rows, int64_t lda,
                  const BlasWeight<uint16_t>& w, float* c, int64_t ldc, bool add_c = false) {
  RECORD_FUNCTION("praxis::brgemm", RecordedProduct(a, rows, lda, w));
  TORCH_CHECK(w.packed != nullptr, "cpu::GatedProduct: a bf16 weight without its packed copy");
#if defined(PRAXIS_X86_SIMD)
  const auto* ab = reinterpret_cast<const at::BFloat16*>(a);
  const int64_t depth = BrgemmDepth(w.k, w.n, sizeof(uint16_t));
  for (int64_t k0 = 0; k0 < w.k; k0 += depth) {
    // Rows k0 / 2 onwards of the packed [K/2, N, 2] copy.
    const at::BFloat16* b = w.packed + k0 * w.packed_ld;
    for (int64_t r = 0; r < m; r += kPieceBrgemmRows) {
      at::native::cpublas::brgemm(std::min(kPieceBrgemmRows, m - r), w.n, std::min(depth, w.k - k0),
                                  lda, w.packed_ld, ldc, add_c || k0 > 0, ab + r * lda + k0, b,
                                  c + r * ldc);
    }
  }
#else
  TORCH_CHECK(false, "cpu::GatedProduct: bf16 pieces need x86's brgemm");
#endif
}
void GatedProduct(const float* a, int64_t m, int64_t rows, int64_t lda, const BlasWeight<float>& w,
                  float* c, int64_t ldc, bool add_c = false) {
#if defined(PRAXIS_X86_SIMD)
  if (!w.layout.transposed && HasFloat32Brgemm()) {
    RECORD_FUNCTION("praxis::brgemm", RecordedProduct(a, rows, lda, w));
    const int64_t depth = BrgemmDepth(w.k, w.n, sizeof(float));
    for (int64_t k0 = 0; k0 < w.k; k0 += depth) {
      for (int64_t r = 0; r < m; r += kPieceBrgemmRows) {
        at::native::cpublas::brgemm(std::min(kPieceBrgemmRows, m - r), w.n,
                                    std::min(depth, w.k - k0), lda, w.layout.ld, ldc,
                                    add_c || k0 > 0, a + r * lda + k0, w.data + k0 * w.layout.ld,
                                    c + r * ldc, /*is_vnni=*/false);
      }
    }
    return;
  }
#endif
  RECORD_FUNCTION("praxis::sgemm", RecordedProduct(a, rows, lda, w));
  const int n = static_cast<int>(w.n), mi = static_cast<int>(m), k = static_cast<int>(w.k);
  const int ldw = static_cast<int>(w.layout.ld), ldx = static_cast<int>(lda);
  const int ldy = static_cast<int>(ldc);
  const float one = 1.0f, beta = add_c ? 1.0f : 0.0f;
  FindBlasSgemm()(w.layout.transposed ? "T" : "N", "N", &n, &mi, &k, &one, w.data, &ldw, a, &ldx,
                  &beta, c, &ldy);
}

// Bytes of scratch a thread keeps between pieces (GatedInto's buffers).
constexpr size_t kKeptPieceBytes = size_t{8} << 20;

template <typename T>
void ReleaseIfLarge(std::vector<T>& v) {
  if (v.capacity() * sizeof(T) > kKeptPieceBytes) std::vector<T>().swap(v);
}

// silu(x·gate) · (x·up) · down for `count` rows of x (rows[i], or from `first`), into out's rows
// from out_first (added onto residual's same rows where it is defined); gate and up are `firsts`
// (one fused gate_up, or the two), down [inner, dim]; T is x's and the weights' element (bf16 bits
// or float). The checks are ExpertPieceInto's and SwiGluPieceInto's (docs there).
template <typename T>
bool GatedInto(const torch::Tensor& x, const int64_t* rows, int64_t first, int64_t count,
               std::initializer_list<BlasWeight<T>> firsts, const BlasWeight<T>& down,
               torch::Tensor& out, int64_t out_first, const torch::Tensor& residual) {
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  if (!CpuBlasOperand<T>(x) || x.dim() != 2 || x.stride(1) != 1 || !out.is_cpu() ||
      out.dim() != 2 || out.stride(1) != 1 ||
      (out.scalar_type() != torch::kFloat32 && out.scalar_type() != kBlasDtype<T>) ||
      (residual.defined() &&
       (!residual.is_cpu() || residual.sizes() != out.sizes() || residual.stride(1) != 1 ||
        residual.scalar_type() != out.scalar_type()))) {
    return false;
  }
  const int64_t dim = x.size(1), inner = down.k;
  int64_t width = 0;
  for (const BlasWeight<T>& w : firsts) {
    if (w.k != dim) return false;
    width += w.n;
  }
  // BLAS refuses a leading dimension under a row's length (and then writes nothing): a run of
  // rows must be laid out as rows; one row is read as such whatever its stride.
  if (count < 1 || dim < 1 || inner < 1 || width != 2 * inner || down.n != dim ||
      out.size(1) != dim || (rows == nullptr && count > 1 && x.stride(0) < dim) || out_first < 0 ||
      out_first + count > out.size(0) ||
      (rows == nullptr && (first < 0 || first + count > x.size(0))) ||
      std::max({x.stride(0), out.stride(0), count, width}) > INT_MAX || !HasPieceGemm<T>()) {
    return false;
  }
  const T* xp = BlasData<T>(x);
  // brgemm's products run over the rows padded to kPieceBrgemmRowStep (zero rows, dropped at
  // the end).
  const int64_t m =
      kBf16 ? (count + kPieceBrgemmRowStep - 1) / kPieceBrgemmRowStep * kPieceBrgemmRowStep : count;
  // Each thread's buffers, sized for the largest piece it has run: no allocation per piece.
  thread_local std::vector<T> gathered, hidden;
  thread_local std::vector<float> products;
  const T* a = xp + first * x.stride(0);
  int64_t lda = count == 1 ? dim : x.stride(0);
  if (rows != nullptr || m != count) {  // the piece's token rows, gathered (and padded)
    gathered.resize(static_cast<size_t>(m * dim));
    std::fill(gathered.begin() + count * dim, gathered.end(), T{0});
    for (int64_t r = 0; r < count; ++r) {
      const int64_t row = rows == nullptr ? first + r : rows[r];
      TORCH_CHECK(row >= 0 && row < x.size(0), "cpu::ExpertPieceInto: row ", row, " out of range");
      std::memcpy(gathered.data() + r * dim, xp + row * x.stride(0), dim * sizeof(T));
    }
    a = gathered.data();
    lda = dim;
  }
  // A float32 out of rows takes the down product straight; else it lands past the products and
  // is stored (rounded where out is bf16).
  const bool direct =
      !kBf16 && out.scalar_type() == torch::kFloat32 && (count == 1 || out.stride(0) >= dim);
  // A thread keeps buffers of up to kKeptPieceBytes for its next piece; a larger one (a wide
  // model's float32 piece) is freed after its piece, so no thread holds one for its life.
  const absl::Cleanup release = [] {
    ReleaseIfLarge(gathered);
    ReleaseIfLarge(hidden);
    ReleaseIfLarge(products);
#if defined(PRAXIS_X86_SIMD)
    // Give the tile configuration back: LibTorch's kernels assume theirs is still loaded.
    if (kBf16) at::native::cpublas::brgemm_release();
#endif
  };
  products.resize(static_cast<size_t>(m * (width + (direct ? 0 : dim))));
  float* c = products.data();
  int64_t column = 0;
  for (const BlasWeight<T>& w : firsts) {
    GatedProduct(a, m, count, lda, w, c + column, width);
    column += w.n;
  }
  // silu(gate) · up in float32 straight from the sums: in place as the float down product's
  // operand, or rounded once as the bf16 one's (a padded row's is 0).
  const T* h = nullptr;
  int64_t ldh = width;
  if constexpr (kBf16) {
    hidden.resize(static_cast<size_t>(m * inner));
    auto* hb = reinterpret_cast<c10::BFloat16*>(hidden.data());
    for (int64_t r = 0; r < m; ++r) {
      float* g = c + r * width;
      SiluMulRowToBf16(g, g + inner, hb + r * inner, inner);
    }
    h = hidden.data();
    ldh = inner;
  } else {
    for (int64_t r = 0; r < m; ++r) {
      float* g = c + r * width;
      SiluMulRowBest(g, g + inner, g, inner);
    }
    h = c;
  }
  // The residual's rows as the down product's C, which it adds onto.
  const auto residual_into = [&](float* y, int64_t ldy) {
    for (int64_t r = 0; r < count; ++r) {
      const int64_t row = (out_first + r) * residual.stride(0);
      if (residual.scalar_type() == torch::kFloat32) {
        Load(residual.const_data_ptr<float>() + row, y + r * ldy, dim);
      } else {
        Load(residual.const_data_ptr<c10::BFloat16>() + row, y + r * ldy, dim);
      }
    }
  };
  if (direct) {
    const int64_t ldo = count == 1 ? dim : out.stride(0);
    float* o = out.mutable_data_ptr<float>() + out_first * out.stride(0);
    if (residual.defined()) residual_into(o, ldo);
    GatedProduct(h, count, count, ldh, down, o, ldo, /*add_c=*/residual.defined());
    return true;
  }
  float* y = c + m * width;
  if (residual.defined()) {
    residual_into(y, dim);
    std::fill(y + count * dim, y + m * dim, 0.0f);  // padded rows: never stored
  }
  GatedProduct(h, m, count, ldh, down, y, dim, /*add_c=*/residual.defined());
  const auto store = [&](auto* o) {
    for (int64_t r = 0; r < count; ++r)
      Store(y + r * dim, o + (out_first + r) * out.stride(0), dim);
  };
  if (out.scalar_type() == torch::kFloat32) {
    store(out.mutable_data_ptr<float>());
  } else {
    store(out.mutable_data_ptr<c10::BFloat16>());
  }
  return true;
}

// GatedInto for T's weights in the forms BlasOperand reads (gate and up fused as `firsts[0]`, or
// the two), false where a weight is of another form or dtype.
template <typename T>
bool GatedIntoOf(const torch::Tensor& x, const int64_t* rows, int64_t first, int64_t count,
                 std::initializer_list<torch::Tensor> firsts, const torch::Tensor& down,
                 int64_t expert, bool linear, torch::Tensor& out, int64_t out_first,
                 const torch::Tensor& residual) {
  TORCH_CHECK(firsts.size() == 1 || firsts.size() == 2, "cpu::GatedIntoOf: 1 or 2 weights");
  std::array<BlasWeight<T>, 2> w{};
  std::array<torch::Tensor, 3> packs;  // the packed copies, alive through the call
  size_t n = 0;
  // t's operand, with its packed copy for brgemm where it is bf16 (PackForBrgemm's: made at load,
  // never here); nullopt where it is not of a form this takes, or not packed.
  auto operand = [&](const torch::Tensor& t) -> std::optional<BlasWeight<T>> {
    std::optional<BlasWeight<T>> o = BlasOperand<T>(t, expert, linear);
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (!o.has_value() || !HasBf16Brgemm()) return std::nullopt;
      torch::Tensor& pack = packs[n];
      pack = WeightCopies::Get().Find(t, CopyForm::kBrgemm, /*transposed=*/linear);
      if (!pack.defined()) return std::nullopt;
      o->packed = pack.const_data_ptr<at::BFloat16>() + (expert < 0 ? 0 : expert * o->k * o->n);
      o->packed_ld = o->n;
    }
    return o;
  };
  for (const torch::Tensor& t : firsts) {
    const std::optional<BlasWeight<T>> o = operand(t);
    if (!o.has_value()) return false;
    w[n++] = *o;
  }
  const std::optional<BlasWeight<T>> dn = operand(down);
  if (!dn.has_value()) return false;
  if (n == 2 && w[0].n != w[1].n) return false;
  return n == 1 ? GatedInto<T>(x, rows, first, count, {w[0]}, *dn, out, out_first, residual)
                : GatedInto<T>(x, rows, first, count, {w[0], w[1]}, *dn, out, out_first, residual);
}

// GatedIntoOf in x's dtype.
bool GatedIntoOfX(const torch::Tensor& x, const int64_t* rows, int64_t first, int64_t count,
                  std::initializer_list<torch::Tensor> firsts, const torch::Tensor& down,
                  int64_t expert, bool linear, torch::Tensor& out, int64_t out_first,
                  const torch::Tensor& residual = {}) {
  return x.scalar_type() == torch::kFloat32
             ? GatedIntoOf<float>(x, rows, first, count, firsts, down, expert, linear, out,
                                  out_first, residual)
             : GatedIntoOf<uint16_t>(x, rows, first, count, firsts, down, expert, linear, out,
                                     out_first, residual);
}

}  // namespace

bool Float32PiecesOnBlas() { return HasPieceGemm<float>(); }

bool HasFloat32Brgemm() {
  static const bool has = [] {
    const char* const env = std::getenv("PRAXIS_FLOAT32_BRGEMM");
    if (env != nullptr && std::atoi(env) == 0) return false;
#if defined(PRAXIS_X86_SIMD)
    return __builtin_cpu_supports("avx512f") && Float32BrgemmComputes();
#else
    return false;
#endif
  }();
  return has;
}

bool PackForBrgemm(const std::vector<BrgemmWeight>& weights) {
  if (!HasBf16Brgemm()) return false;
  std::vector<torch::Tensor> views;
  for (const BrgemmWeight& w : weights) {
    const torch::Tensor v = w.linear ? w.w.transpose(-1, -2) : w.w;
    if (!v.is_cpu() || v.scalar_type() != torch::kBFloat16 || v.dim() < 2 || v.dim() > 3 ||
        v.size(-2) % 2 != 0) {
      return false;
    }
    views.push_back(v);
  }
  return WeightCopies::Get().MakeAll(views, CopyForm::kBrgemm);
}

bool ExpertPieceInto(const torch::Tensor& x, const int64_t* rows, int64_t first, int64_t count,
                     const torch::Tensor& gate_up, const torch::Tensor& down, int64_t expert,
                     torch::Tensor& out, int64_t out_first) {
  return GatedIntoOfX(x, rows, first, count, {gate_up}, down, expert, /*linear=*/false, out,
                      out_first);
}

namespace {

// x's rows as BrgemmLinear reads them: `batches` runs of `rows` rows, rows `row_stride` apart
// and runs `batch_stride` apart (elements; the last dimension unit-stride).
struct RowRuns {
  int64_t batches = 1, rows = 1, batch_stride = 0, row_stride = 0;

  // Where row `row` (counted over all runs) starts, in elements.
  int64_t Offset(int64_t row) const { return row / rows * batch_stride + row % rows * row_stride; }
};

// x's leading dimensions (size-1 ones skipped) folded into runs of rows: the innermost and those
// that continue its stride into rows, the rest into runs where they fold into one stride; nullopt
// where they do not (or rows overlap, as an expanded tensor's).
std::optional<RowRuns> RowRunsOf(const torch::Tensor& x) {
  const int64_t k = x.size(-1);
  if (x.dim() < 2 || (x.stride(-1) != 1 && k > 1)) return std::nullopt;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride), outermost first
  for (int64_t d = 0; d + 1 < x.dim(); ++d) {
    if (x.size(d) != 1) dims.emplace_back(x.size(d), x.stride(d));
  }
  // The innermost dimension left as a count and stride, with the dimensions outside it that
  // continue that stride folded into the count.
  const auto fold = [&dims](int64_t& count, int64_t& stride) {
    if (dims.empty()) return;
    std::tie(count, stride) = dims.back();
    dims.pop_back();
    while (!dims.empty() && dims.back().second == stride * count) {
      count *= dims.back().first;
      dims.pop_back();
    }
  };
  RowRuns r{.row_stride = k};
  fold(r.rows, r.row_stride);
  fold(r.batches, r.batch_stride);
  if (!dims.empty() || r.row_stride < k) return std::nullopt;
  return r;
}

// t with its rows as runs (RowRunsOf): t itself where they fold, else a copy of t in rows (video
// tokens read channel-major, an expanded view); nullopt where even that does not.
std::optional<std::pair<torch::Tensor, RowRuns>> InRuns(const torch::Tensor& t) {
  if (const std::optional<RowRuns> r = RowRunsOf(t)) return std::pair{t, *r};
  const torch::Tensor rows = t.contiguous();
  if (const std::optional<RowRuns> r = RowRunsOf(rows)) return std::pair{rows, *r};
  return std::nullopt;
}

// Rows of a BrgemmLinear task: the intra-op threads take tasks from a shared counter, so that a
// thread held up elsewhere on these 2 shared cores leaves the rest of the product to the other.
constexpr int64_t kLinearTaskRows = 64;

// A product of fewer row tasks than threads is cut by columns as well, into about two tasks a
// thread, where it holds at least kLinearSplitWork multiply-adds (~20 µs on one core): a text's 32
// tokens through the bench config's [2560, 512] projection took 1.8 ms on one thread of two.
// Column blocks are multiples of kLinearTaskColumnStep wide (the brgemm kernels' vector width).
constexpr int64_t kLinearSplitWork = int64_t{1} << 20, kLinearTaskColumnStep = 16;

// Column blocks of a BrgemmLinear of m rows (row_tasks tasks of rows), n columns and depth k: the
// width of each (the last may be narrower); n where the product is not cut by columns.
int64_t LinearColumnBlock(int64_t m, int64_t n, int64_t k, int64_t row_tasks) {
  const int64_t threads = at::get_num_threads();
  if (row_tasks >= threads || m * n * k < kLinearSplitWork) return n;
  const int64_t blocks = (2 * threads + row_tasks - 1) / row_tasks;
  const int64_t step = kLinearTaskColumnStep;
  return std::min(n, ((n + blocks - 1) / blocks + step - 1) / step * step);
}

// BrgemmLinear in T (float, or bf16 bits over the weight's packed copy); the checks are
// BrgemmLinear's (docs there).
template <typename T>
torch::Tensor LinearOnBrgemm(const torch::Tensor& x_in, const torch::Tensor& w,
                             const torch::Tensor& b, const torch::Tensor& residual_in) {
  constexpr bool kBf16 = std::is_same_v<T, uint16_t>;
  if (!CpuBlasOperand<T>(x_in) || x_in.dim() < 2 ||
      !(kBf16 ? HasBf16Brgemm() : HasFloat32Brgemm())) {
    return {};
  }
  std::optional<BlasWeight<T>> wt = BlasOperand<T>(w, -1, /*linear=*/true);
  if (!wt.has_value() || wt->k != x_in.size(-1) ||
      (b.defined() &&
       (!CpuBlasOperand<T>(b) || b.dim() != 1 || b.size(0) != wt->n || b.stride(0) != 1))) {
    return {};
  }
  std::vector<int64_t> sizes(x_in.sizes().begin(), x_in.sizes().end());
  sizes.back() = wt->n;
  if (residual_in.defined() &&
      (!CpuBlasOperand<T>(residual_in) || residual_in.sizes() != c10::IntArrayRef(sizes))) {
    return {};
  }
  const auto xs = InRuns(x_in);
  const auto rs = residual_in.defined() ? InRuns(residual_in) : std::pair{residual_in, RowRuns{}};
  if (!xs.has_value() || !rs.has_value()) return {};
  // Named references, not structured bindings: the task lambda below captures them (clang 14,
  // the fuzzers' compiler, captures no binding).
  const torch::Tensor& x = xs->first;
  const RowRuns& runs = xs->second;
  const torch::Tensor& residual = rs->first;
  const RowRuns& rruns = rs->second;
  torch::Tensor pack;  // a bf16 weight's packed copy (PackForBrgemm's, made at load), alive here
  if constexpr (kBf16) {
    pack = WeightCopies::Get().Find(w, CopyForm::kBrgemm, /*transposed=*/true);
    if (!pack.defined()) return {};
    wt->packed = pack.const_data_ptr<at::BFloat16>();
    wt->packed_ld = wt->n;
  } else if (wt->layout.transposed) {
    return {};
  }
  const int64_t n = wt->n, rows = runs.rows, m = runs.batches * rows;
  if (m == 0 || n == 0 || wt->k == 0) return {};
  torch::Tensor y = torch::empty(sizes, x.options());
  // y's, the residual's and the bias's elements as Load and Store take them.
  using Elem = std::conditional_t<kBf16, c10::BFloat16, float>;
  const T* xp = BlasData<T>(x);
  const Elem* rp = residual.defined() ? residual.const_data_ptr<Elem>() : nullptr;
  Elem* yp = y.mutable_data_ptr<Elem>();
  std::vector<float> bias;  // b in float32, added onto each row's C
  if (b.defined()) {
    bias.resize(static_cast<size_t>(n));
    Load(b.const_data_ptr<Elem>(), bias.data(), n);
  }
  const bool add_c = rp != nullptr || b.defined();
  const int64_t row_tasks = (m + kLinearTaskRows - 1) / kLinearTaskRows;
  const int64_t width = LinearColumnBlock(m, n, wt->k, row_tasks);
  const int64_t column_tasks = (n + width - 1) / width;
  RunTasks(row_tasks * column_tasks, [&](int64_t task) {
    // A bf16 product's float32 sums, rounded once into y's rows.
    thread_local std::vector<float> sums;
    if constexpr (kBf16) sums.resize(static_cast<size_t>(kPieceBrgemmRows * width));
    const int64_t first = task % column_tasks * width, cols = std::min(width, n - first);
    const BlasWeight<T> wc = ColumnsOf(*wt, first, cols);
    const int64_t end = std::min(m, (task / column_tasks + 1) * kLinearTaskRows);
    for (int64_t g = task / column_tasks * kLinearTaskRows; g < end;) {
      const int64_t r = g % rows;
      const int64_t count = std::min({kPieceBrgemmRows, rows - r, end - g});
      const T* a = xp + runs.Offset(g);
      // C's rows: the sums buffer's (ldc = cols) or y's own (ldc = n).
      float* c = nullptr;
      int64_t ldc = n;
      if constexpr (kBf16) {
        c = sums.data();
        ldc = cols;
      } else {
        c = yp + g * n + first;
      }
      // The residual and the bias as C's rows, which the product adds onto (add_C), as addmm's
      // beta does.
      for (int64_t i = 0; add_c && i < count; ++i) {
        float* ci = c + i * ldc;
        if (rp == nullptr) {
          std::copy_n(bias.begin() + first, cols, ci);
          continue;
        }
        Load(rp + rruns.Offset(g + i) + first, ci, cols);
        if (!bias.empty()) AxpyRow(ci, 1.0f, bias.data() + first, cols);
      }
      GatedProduct(a, count, count, runs.row_stride, wc, c, ldc, add_c);
      if constexpr (kBf16) {
        for (int64_t i = 0; i < count; ++i) Store(c + i * ldc, yp + (g + i) * n + first, cols);
      }
      g += count;
    }
#if defined(PRAXIS_X86_SIMD)
    // Give the tile configuration back: LibTorch's kernels assume theirs is still loaded.
    if constexpr (kBf16) at::native::cpublas::brgemm_release();
#endif
  });
  return y;
}

}  // namespace

torch::Tensor BrgemmLinear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                           const torch::Tensor& residual) {
  if (x.scalar_type() == torch::kFloat32) return LinearOnBrgemm<float>(x, w, b, residual);
  if (x.scalar_type() == torch::kBFloat16) return LinearOnBrgemm<uint16_t>(x, w, b, residual);
  return {};
}

bool SwiGluPieceInto(const torch::Tensor& x, int64_t first, int64_t count, const torch::Tensor& a,
                     const torch::Tensor& b, const torch::Tensor& down, torch::Tensor& out,
                     const torch::Tensor& residual) {
  return GatedIntoOfX(x, nullptr, first, count, {a, b}, down, -1, /*linear=*/true, out, first,
                      residual);
}

void SetFloat32WeightBudget(int64_t bytes) { WeightCopies::Get().SetBudget(bytes); }

std::optional<Float32WeightHold> HoldFloat32WeightBytes(int64_t bytes) {
  if (!WeightCopies::Get().Hold(bytes)) return std::nullopt;
  return Float32WeightHold(bytes);
}

Float32WeightHold::~Float32WeightHold() {
  if (bytes_ > 0) WeightCopies::Get().Release(bytes_);
}

}  // namespace praxis::model::cpu
