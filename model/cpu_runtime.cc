#include "model/cpu_runtime.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "model/cpu_kernels.h"

// LibTorch's wheel links libgomp and exports MKL's per-thread setter; neither has a header there.
extern "C" void omp_set_num_threads(int threads);
extern "C" int MKL_Set_Num_Threads_Local(int threads);  // the C entry (lower case is Fortran)

namespace praxis::model {

void DefaultToOneIntraOpThread() {
  // Sets the default every new thread takes at its first parallel op, and MKL's global count.
  at::set_num_threads(1);
}

void SetIntraOpThreadsOfThisThread(int threads) {
  // LibTorch sets a thread up to the process default at its first parallel op, once per copy of
  // its inline lazy_init_num_threads: libtorch's own (get_num_threads runs it) and ours, in the
  // at::parallel_for of model/cpu_kernels. Both first, so that neither undoes what follows (ours
  // did: served steps ran on one core).
  (void)at::get_num_threads();
  at::internal::lazy_init_num_threads();
  omp_set_num_threads(threads);
  MKL_Set_Num_Threads_Local(threads);
}

namespace {

// How much faster the other count must run to be taken; how long a probe runs, in probe_every;
// the most windows between probes; the fall in a window's rate that probes at once.
constexpr double kSwitchMargin = 1.1;
constexpr double kProbeShare = 1.0 / 40;
constexpr int kMaxBackoff = 8;
constexpr double kDropToProbe = 0.5;

}  // namespace

IntraOpThreadChooser::IntraOpThreadChooser(int threads, absl::Duration probe_every)
    : most_(threads), probe_every_(probe_every), count_(threads) {}

void IntraOpThreadChooser::Record(double cost, absl::Duration took) {
  took = std::max(took, absl::Nanoseconds(1));
  if (probing_) {
    probe_.cost += cost;
    probe_.time += took;
    if (probe_.time >= probe_every_ * kProbeShare) EndProbe();
    return;
  }
  window_.cost += cost;
  window_.time += took;
  if (window_.time < probe_every_) return;
  const double rate = window_.rate();
  const bool dropped = last_rate_ > 0 && rate < last_rate_ * kDropToProbe;
  last_rate_ = rate;
  if (dropped || ++windows_since_probe_ >= backoff_) {
    StartProbe(dropped);  // against this window's rate, kept in window_
  } else {
    window_ = {};
  }
}

void IntraOpThreadChooser::StartProbe(bool fewer_first) {
  const bool fewer = count_ > 1, more = count_ < most_;
  bool up = more && (!fewer || (up_next_ && !fewer_first));
  if (fewer && more && !fewer_first) up_next_ = !up_next_;
  probe_count_ = up ? count_ + 1 : count_ - 1;
  probing_ = true;
  probe_ = {};
  ++probes_;
}

void IntraOpThreadChooser::EndProbe() {
  probing_ = false;
  windows_since_probe_ = 0;
  if (probe_.rate() > window_.rate() * kSwitchMargin) {
    count_ = probe_count_;
    ++switches_;
    backoff_ = 1;
    last_rate_ = probe_.rate();
  } else {
    backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  }
  window_ = {};
}

CpuIsa DetectCpuIsa() {
  CpuIsa isa;
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    isa.avx512f = (b >> 16) & 1;
    isa.avx512_fp16 = (d >> 23) & 1;
    isa.amx_bf16 = (d >> 22) & 1;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    isa.avx512_bf16 = (a >> 5) & 1;
    isa.amx_fp16 = (a >> 21) & 1;
  }
  char brand[49] = {};
  for (unsigned leaf = 0; leaf < 3; ++leaf) {
    unsigned r[4] = {};
    if (!__get_cpuid(0x80000002 + leaf, &r[0], &r[1], &r[2], &r[3])) break;
    std::memcpy(brand + 16 * leaf, r, 16);
  }
  isa.model = std::string(absl::StripAsciiWhitespace(brand));
#endif
  isa.bf16_brgemm = cpu::HasBf16Brgemm();
  isa.float32_brgemm = cpu::HasFloat32Brgemm();
  return isa;
}

bool HasUnitsFor(const CpuIsa& isa, torch::ScalarType dtype) {
  if (dtype == torch::kBFloat16) return isa.amx_bf16 || isa.avx512_bf16;
  if (dtype == torch::kFloat16) return isa.amx_fp16 || isa.avx512_fp16;
  return true;
}

namespace {

// LibTorch's matmul rate in `dtype` over its float32 rate, measured now (MatmulSpeedup).
double MeasureMatmulSpeedup(torch::ScalarType dtype) {
  const auto best_seconds = [](torch::ScalarType t) {
    const torch::Tensor a = torch::randn({512, 512}).to(t), b = torch::randn({512, 512}).to(t);
    torch::Tensor c = torch::empty({512, 512}, a.options());
    return cpu::BestSeconds(8, [&] { at::mm_out(c, a, b); });
  };
  return best_seconds(torch::kFloat32) / best_seconds(dtype);
}

}  // namespace

double MatmulSpeedup(torch::ScalarType dtype) {
  if (dtype == torch::kFloat32) return 1;
  const auto measured = [](torch::ScalarType t) {
    return HasUnitsFor(DetectCpuIsa(), t) ? MeasureMatmulSpeedup(t) : 0.0;
  };
  // Each dtype is timed at its own first call only: a bf16 server never times float16.
  if (dtype == torch::kBFloat16) {
    static const double bf16 = measured(torch::kBFloat16);
    return bf16;
  }
  if (dtype == torch::kFloat16) {
    static const double fp16 = measured(torch::kFloat16);
    return fp16;
  }
  return 0;
}

bool ReducedGemmInFloat32(torch::ScalarType dtype) {
  if (dtype != torch::kBFloat16 && dtype != torch::kFloat16) return false;
  static const char* const env = std::getenv("PRAXIS_REDUCED_GEMM_IN_FLOAT32");
  if (env != nullptr) return std::atoi(env) != 0;
  return MatmulSpeedup(dtype) < 1;  // 0 (emulated) included
}

std::string DescribeCpuForDtype(const CpuIsa& isa, torch::ScalarType dtype, double matmul_speedup,
                                Float32Path path, bool* slow) {
  std::vector<std::string> units;
  if (isa.amx_bf16) units.push_back("AMX-BF16");
  if (isa.amx_fp16) units.push_back("AMX-FP16");
  if (isa.avx512_bf16) units.push_back("AVX512-BF16");
  if (isa.avx512_fp16) units.push_back("AVX512-FP16");
  if (isa.avx512f) units.push_back("AVX-512");
  const std::string name = dtype == torch::kBFloat16 ? "bfloat16" : "float16";
  const std::string measured =
      matmul_speedup > 0 ? absl::StrFormat(" (measured %.2fx float32's rate)", matmul_speedup) : "";
  const std::string in_float32 =
      absl::StrCat("the model is computed in float32 (its ", name, " weights converted at load)");
  std::string implies;
  *slow = false;
  if (dtype == torch::kFloat32) {
    implies = isa.float32_brgemm ? "float32, its Linears and SwiGLU layers on oneDNN's brgemm"
                                 : "float32";
  } else if (!HasUnitsFor(isa, dtype)) {
    if (path == Float32Path::kModel) {
      implies = absl::StrCat(name, " has no hardware path here: ", in_float32);
    } else {
      *slow = true;
      implies = absl::StrCat(
          name, " has no hardware path here and is emulated",
          path == Float32Path::kMatmuls ? " (its matmuls run on the float32 GEMM)" : "",
          ": expect it several times slower than float32 (--dtype=float32)");
    }
  } else if (matmul_speedup > 0 && matmul_speedup < 1) {
    // AVX512-BF16 without AMX on a Xeon: vdpbf16ps measured 1.4x the FMA's multiply-adds per
    // second there, and oneDNN's bf16 GEMM 0.48-0.58x LibTorch's float32 one (stop 26).
    *slow = path == Float32Path::kNone;
    const std::string slower =
        absl::StrCat("LibTorch's ", name, " GEMM is the slower one here", measured);
    if (path == Float32Path::kModel) {
      implies = absl::StrCat(slower, ": ", in_float32);
    } else if (path == Float32Path::kMatmuls) {
      implies = absl::StrCat(slower, ": its matmuls run on the float32 GEMM");
    } else {
      implies = absl::StrCat(name, " matmuls are slower than float32's here", measured, ": expect ",
                             name, " steps slower than float32 (--dtype=float32)");
    }
  } else if (path == Float32Path::kModel) {  // forced (PRAXIS_REDUCED_GEMM_IN_FLOAT32=1)
    implies = absl::StrCat(in_float32, measured);
  } else if (dtype == torch::kBFloat16) {
    // Attention follows cpu::TileAttention's choice: its products take oneDNN's bf16 brgemm (on
    // the same units) for heads of cpu::kBf16BrgemmMinHeadDim and wider where LibTorch has it.
    implies = absl::StrCat(
        "bfloat16 matmuls run on ", isa.amx_bf16 ? "AMX tiles" : "AVX512-BF16", measured,
        isa.bf16_brgemm
            ? absl::StrCat(", attention too at head dims from ", cpu::kBf16BrgemmMinHeadDim)
            : "; attention runs float32 FMAs here (LibTorch's brgemm takes no bfloat16 here)");
    // Where brgemm takes bf16, the Linears and SwiGLU layers run on it (cpu::BrgemmLinear,
    // cpu::ExpertPieceInto); elsewhere on LibTorch's GEMM.
    if (isa.bf16_brgemm) implies += "; its Linears and SwiGLU layers on oneDNN's brgemm";
  } else {
    implies = absl::StrCat("float16 runs on its own units", measured);
  }
  return absl::StrCat("cpu ", isa.model.empty() ? "unknown" : isa.model, " [",
                      units.empty() ? "no AVX-512" : absl::StrJoin(units, " "), "]: ", implies);
}

}  // namespace praxis::model
