#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"

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

// Picks the intra-op thread count of each run of a CPU worker, between 1 and its configured
// count. A spinning OpenMP team loses badly to another busy process on its cores (a bench small
// float32 B8 step took ~660 ms at 2 threads against ~66 ms at 1 with one busy process on one of 2
// cores, and ~30-55 ms at 2 when quiet: docs/benchmarks.md stop 39), and no setting of the team
// wins both ways (OMP_WAIT_POLICY=passive cost up to 26 % of served throughput on quiet cores). So
// the worker keeps the count that ran fastest and, after each `probe_every` of its runs' time,
// times a neighbouring count (one thread fewer and one more in turn, within range) on runs of at
// least probe_every / 40 (at least one run), moving to it when it is more than 10 % faster. A probe
// that loses doubles the wait before the next (up to 8 x probe_every), so a worker that is well
// where it is spends little time trying others, and a window whose rate falls to half the one
// before it probes one thread fewer at once (a busy neighbour has just started). Rates are cost per
// second of runs (cost: any measure of a run's work, e.g. StepCost's GFLOP), so batches of any
// size compare; idle time between runs does not count. Not thread-safe: one worker's.
class IntraOpThreadChooser {
 public:
  // threads >= 2 (the most it takes, and where it starts); probe_every > 0.
  IntraOpThreadChooser(int threads, absl::Duration probe_every);

  // The count for the next run, and the count in use between probes.
  int Next() const { return probing_ ? probe_count_ : count_; }
  int count() const { return count_; }
  // The run Next() chose took `took` for `cost` (> 0) of work.
  void Record(double cost, absl::Duration took);
  // Probes run so far, and how many of them changed the count.
  int64_t probes() const { return probes_; }
  int64_t switches() const { return switches_; }

 private:
  struct Window {
    double cost = 0;
    absl::Duration time;
    double rate() const { return cost / absl::ToDoubleSeconds(time); }
  };
  void StartProbe(bool fewer_first);
  void EndProbe();

  const int most_;
  const absl::Duration probe_every_;
  int count_;  // the count in use
  bool probing_ = false;
  int probe_count_ = 0;   // the count a probe runs
  bool up_next_ = false;  // where both neighbours exist: the next probe tries one more
  int backoff_ = 1;       // windows of probe_every between probes
  int windows_since_probe_ = 0;
  Window window_;         // the current window on count_
  double last_rate_ = 0;  // the last full window's rate (0: none yet)
  Window probe_;
  int64_t probes_ = 0, switches_ = 0;
};

// The x86 units that decide how fast a reduced-precision step runs on this CPU (all false
// elsewhere), from cpuid.
struct CpuIsa {
  std::string model;         // the brand string, e.g. "Intel(R) Xeon(R) Processor"
  bool avx512f = false;      // AVX-512 foundation
  bool avx512_bf16 = false;  // bf16 dot products in AVX-512 (Zen 4, Cooper Lake and later)
  bool amx_bf16 = false;     // AMX tiles with bf16 (Sapphire Rapids and later)
  bool avx512_fp16 = false;  // fp16 arithmetic in AVX-512
  bool amx_fp16 = false;     // AMX tiles with fp16 (Granite Rapids)
  bool bf16_brgemm = false;  // LibTorch's brgemm takes bf16 here (cpu::HasBf16Brgemm)
  bool float32_brgemm = false;  // and float32 on AVX-512 (cpu::HasFloat32Brgemm)
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
// given `matmul_speedup` (MatmulSpeedup; 0: not measured) and the model's float32 `path`. `slow`
// is set when the dtype is emulated here, or its matmuls measured slower than float32's, and the
// model still runs in it.
std::string DescribeCpuForDtype(const CpuIsa& isa, torch::ScalarType dtype, double matmul_speedup,
                                Float32Path path, bool* slow);

}  // namespace praxis::model
