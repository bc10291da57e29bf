#pragma once

// The GEMM calls a piece of code makes, on every thread (LibTorch's aten mm, addmm, bmm, baddbmm,
// and the products of cpu::BrgemmLinear and cpu::ExpertPieceInto): for step_bench's --gemm_bound (a
// step beside the time of its GEMMs alone, the bound for a GEMM-bound cell) and for the
// test that the step cost model counts every matmul a forward runs.

#include <torch/torch.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "model/config.h"
#include "model/masks.h"

namespace praxis::bench {

// One GEMM call: its op and its tensor operands' sizes, strides and dtype (an out= variant's
// output left out: a replay makes its own).
struct GemmCall {
  using Operand = std::tuple<std::vector<int64_t>, std::vector<int64_t>, c10::ScalarType>;
  // "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", or "praxis::sgemm" and
  // "praxis::brgemm" (the float and bf16 products of cpu::BrgemmLinear, ExpertPieceInto and
  // SwiGluPieceInto: (x, w), replayed as aten::mm)
  std::string op;
  std::vector<Operand> operands;
  // Made inside an intra-op parallel region (the CPU MoE's pieces): on one thread, beside
  // others on the other threads.
  bool in_parallel_region = false;

  // Multiply-adds x 2 of the product (batch x m x k x n).
  double Flops() const;
};

// The GEMM calls `run` makes, from any thread (the CPU MoE's pieces run theirs on the intra-op
// threads), in the order they start. Installs a global RecordFunction callback for the duration:
// one recording at a time per process.
std::vector<GemmCall> RecordGemms(const std::function<void()>& run);

// The products of a step's attention over the pairs its mask allows, as the fewest and largest
// GEMMs that do them: per block of each tower and rectangle of allowed pairs
// (model::AllowedBlocks), q·kᵀ as bmm [rows·kvH, g·nq, hd]·[rows·kvH, hd, nk] (the g = H / kvH
// query heads of a key head stacked) and p·v as bmm [rows·kvH, g·nq, nk]·[rows·kvH, nk, hd],
// contiguous, in `dtype`. A step must do these whatever kernel runs its attention; --gemm_bound
// times them beside its other GEMMs. `layout`'s registers are taken from `config`.
std::vector<GemmCall> AttentionProducts(const model::BackboneConfig& config,
                                        model::WindowLayout layout, bool decode, int64_t rows,
                                        c10::ScalarType dtype);

// The calls run alone, in order, `repeats` times after one warm-up, as the step ran them: each on
// LibTorch's intra-op threads, except that consecutive calls made inside a parallel region run
// one per thread side by side again (each split across the threads instead, a small piece's GEMM
// gains only 1.3-1.8x from the second thread, which would flatter the step's ratio). The median
// of their total in milliseconds. Operands of one layout are one random tensor, as a step's
// weights are.
double TimeGemmsMs(const std::vector<GemmCall>& calls, int repeats);

}  // namespace praxis::bench
