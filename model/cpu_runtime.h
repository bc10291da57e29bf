#pragma once

#include <torch/types.h>

#include <string>

// Process settings for running LibTorch on CPUs in a server: where intra-op parallelism runs (how
// freed memory is kept is the allocator's: the model's executables link tcmalloc, CMakeLists.txt).
//
// Intra-op parallelism runs on the model's worker thread only.
// LibTorch's CPU ops and MKL's GEMMs run on OpenMP, and every thread that runs a parallel region
// keeps its own team. libgomp lets a team spin between regions only while it manages no more
// threads than there are CPUs; past that it sleeps and wakes through futexes at every op. With the
// intra-op count set process-wide, the main thread (loading), gRPC's threads (decoding, checks)
// and the batcher each grew a team, and a 2-core server at --threads=2 spent 36 % of its time in
// futex wake/wait, its step taking 12 ms against 4 ms in a single-threaded process (docs/
// benchmarks.md). So every thread defaults to one intra-op thread, and the thread that runs the
// model raises its own count.

namespace praxis::model {

// Makes the calling thread, and every thread that runs its first LibTorch op later, use one
// intra-op thread. Call once, first thing in main, before any LibTorch work. Not thread-safe.
void DefaultToOneIntraOpThread();

// Makes LibTorch ops and MKL GEMMs on the calling thread use `threads` intra-op threads (its own
// OpenMP team); other threads keep theirs. threads >= 1.
void SetIntraOpThreadsOfThisThread(int threads);

// The x86 units that decide how fast a reduced-precision step runs on this CPU (all false
// elsewhere), from cpuid.
struct CpuIsa {
  std::string model;         // the brand string, e.g. "Intel(R) Xeon(R) Processor"
  bool avx512f = false;      // AVX-512 foundation
  bool avx512_bf16 = false;  // bf16 dot products in AVX-512 (Zen 4, Cooper Lake and later)
  bool amx_bf16 = false;     // AMX tiles with bf16 (Sapphire Rapids and later)
  bool avx512_fp16 = false;  // fp16 arithmetic in AVX-512
  bool amx_fp16 = false;     // AMX tiles with fp16 (Granite Rapids)
};
CpuIsa DetectCpuIsa();

// Whether `isa` has units for `dtype`'s arithmetic (float32: always); without them LibTorch
// emulates it (a bf16 step measured 29.5 s against 5 s in float32, docs/benchmarks.md).
bool HasUnitsFor(const CpuIsa& isa, torch::ScalarType dtype);

// LibTorch's matmul rate in `dtype` over its float32 rate, measured at the first call for each
// dtype (512³ products on the calling thread's intra-op threads, best of 8 each: ~30 ms) and
// remembered. The units alone do not tell: bf16 on AVX512-BF16 ran 2.7x float32 on Zen 4 and
// 0.48-0.58x on a Xeon without AMX (docs/benchmarks.md). 0 where !HasUnitsFor(DetectCpuIsa(),
// dtype): emulated products would take seconds to time. Thread-safe.
double MatmulSpeedup(torch::ScalarType dtype);

// Whether the CPU runs `dtype` (bf16 / fp16) matmuls on the float32 GEMM (cpu::MatmulViaFloat32):
// where LibTorch's own GEMM in that dtype is emulated or measured slower than its float32 one
// (MatmulSpeedup < 1). The environment variable PRAXIS_REDUCED_GEMM_IN_FLOAT32 (0 or 1), read
// once, overrides it for benchmarks. Thread-safe.
bool ReducedGemmInFloat32(torch::ScalarType dtype);

// Where a 16-bit model's work runs in float32 on a CPU (ReducedGemmInFloat32 says whether any).
enum class Float32Path {
  kNone,     // in its own dtype throughout
  kMatmuls,  // its matmuls on the float32 GEMM (cpu::MatmulViaFloat32), the rest in its dtype
  kModel,    // all of it: the weights converted at load (VideoBackbone::compute_dtype)
};

// One line for the start-up log: the CPU, its units, and what running in `dtype` implies on it,
// given `matmul_speedup` (MatmulSpeedup; 0: not measured), `small_gemm_speedup` (where a bf16
// model's small products take MKL's GEMM: cpu::SmallBf16GemmSpeedup; 0: they do not) and the
// model's float32 `path`. `slow` is set when the dtype is emulated here, or its matmuls measured
// slower than float32's, and the model still runs in it.
std::string DescribeCpuForDtype(const CpuIsa& isa, torch::ScalarType dtype, double matmul_speedup,
                                double small_gemm_speedup, Float32Path path, bool* slow);

}  // namespace praxis::model
