#include "model/layers.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if !defined(PRAXIS_TORCH_CPU_ONLY)
#include <ATen/cuda/CUDAContext.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "model/cpu_kernels.h"
#include "model/cpu_runtime.h"

namespace praxis::model {

namespace {

// Rows of one piece of expert work on the CPU: one thread's float32 GEMM of the bench config's
// expert shapes ([n, 128]·[128, 512]) over ~300 rows runs at 92 % of its rate over 1200 (measured,
// torch.mm on 1 thread: 152 against 165 GFLOP/s), and smaller pieces balance the threads better.
constexpr int64_t kMoePieceRows = 256;

// Whether a matmul against the 16-bit weight `w` runs on the float32 GEMM (cpu::MatmulViaFloat32).
bool GemmInFloat32(const torch::Tensor& x, const torch::Tensor& w) {
  return !x.is_cuda() && w.scalar_type() != torch::kFloat32 &&
         ReducedGemmInFloat32(w.scalar_type());
}

// Whether a SwiGLU's pieces run on a GEMM of ours (cpu::ExpertPieceInto): float32 values and
// weights where libtorch_cpu has BLAS's sgemm_, bf16 ones on oneDNN's brgemm.
bool PiecesOnOurGemm(const torch::Tensor& x, const torch::Tensor& w) {
  if (!x.is_cpu() || x.scalar_type() != w.scalar_type()) return false;
  if (x.scalar_type() == torch::kFloat32) return cpu::Float32PiecesOnBlas();
  return x.scalar_type() == torch::kBFloat16 && !GemmInFloat32(x, w) && cpu::HasBf16Brgemm();
}

// x · w for a weight w [in, out] (the experts' layout), in w's dtype; with `keep_float32`, where
// the GEMM runs in float32 anyway, left in float32.
torch::Tensor MatmulWeight(const torch::Tensor& x, const torch::Tensor& w,
                           bool keep_float32 = false) {
  if (!GemmInFloat32(x, w)) return torch::matmul(x, w);
  return cpu::MatmulViaFloat32(x, w, {}, keep_float32 ? torch::kFloat32 : w.scalar_type());
}

}  // namespace

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                     const torch::Tensor& residual) {
  const auto plus_residual = [&residual](const torch::Tensor& y) {
    return residual.defined() ? residual + y : y;
  };
  if (GemmInFloat32(x, w)) return plus_residual(cpu::MatmulViaFloat32(x, w.t(), b));
  const torch::Tensor xd = x.to(w.scalar_type());
  // On oneDNN's brgemm where the weight is laid out (float32) or packed (bf16) for it, its rows
  // read in place (cpu::BrgemmLinear).
  if (torch::Tensor y = cpu::BrgemmLinear(xd, w, b, residual); y.defined()) return y;
  // Else in bf16 / fp16, as one 2-D addmm over the rows (bias fused): at::linear fuses only up to
  // three dimensions, contiguous, and sends the rest (video tokens as a permuted view, a narrowed
  // run of tokens, 5-D modulation inputs) through matmul, which copied strided ones to contiguous
  // anyway and then added the bias in a separate pass. Float32 stays with at::linear: MKL's batched
  // GEMM reads a strided input in place (copying it first cost ~3 % of a bench small B8 step).
  if (xd.scalar_type() != torch::kFloat32) {
    std::vector<int64_t> shape(xd.sizes().begin(), xd.sizes().end());
    shape.back() = w.size(0);
    const torch::Tensor rows = xd.reshape({-1, xd.size(-1)});
    return plus_residual(torch::linear(rows, w, b).view(shape));
  }
  return plus_residual(torch::linear(xd, w, b));
}

torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNormWith(x, NormWeight(weight), eps);
}

torch::Tensor NormWeight(const torch::Tensor& weight, double scale) {
  return (1.0 + weight.to(torch::kFloat32)) * scale;
}

torch::Tensor RmsNormWith(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  if (!x.is_cuda()) return cpu::RmsNorm(x, w, eps);
  const torch::Tensor xf = x.to(torch::kFloat32);
  return (xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps) * w).to(x.scalar_type());
}

torch::Tensor Modulate(const torch::Tensor& x, const torch::Tensor& shift,
                       const torch::Tensor& scale, torch::ScalarType dtype,
                       const torch::Tensor& out) {
  if (!x.is_cuda() && dtype == torch::kFloat32 &&
      (!out.defined() || (out.scalar_type() == x.scalar_type() && out.stride(-1) == 1))) {
    return cpu::Modulate(x, shift.to(dtype), scale.to(dtype), out);
  }
  torch::Tensor y =
      torch::addcmul(shift.to(dtype), x.to(dtype), scale.to(dtype)).to(x.scalar_type());
  return out.defined() ? out.copy_(y) : y;
}

torch::Tensor FourierFeatures(const torch::Tensor& t, const torch::Tensor& freqs,
                              const torch::Tensor& phases) {
  const torch::Tensor tf = t.to(torch::kFloat32).unsqueeze(-1);
  return 0.5 * torch::cos(2.0 * std::numbers::pi * (tf * freqs + phases));
}

torch::Tensor VideoTokens(const torch::Tensor& x) {
  return x.permute({0, 2, 3, 4, 1}).reshape({x.size(0), -1, x.size(1)});
}

torch::Tensor UnpatchTokens(const torch::Tensor& x, int64_t ph, int64_t pw) {
  const int64_t b = x.size(0), c = x.size(1) / (ph * pw), f = x.size(2), h = x.size(3),
                w = x.size(4);
  return x.reshape({b, c, ph, pw, f, h, w})
      .permute({0, 4, 5, 2, 6, 3, 1})
      .reshape({b, f * h * ph * w * pw, c});
}

torch::Tensor Patchify(const torch::Tensor& x, int64_t ph, int64_t pw) {
  const int64_t b = x.size(0), c = x.size(1), f = x.size(2), h = x.size(3) / ph, w = x.size(4) / pw;
  return x.reshape({b, c, f, h, ph, w, pw})
      .permute({0, 1, 4, 6, 2, 3, 5})
      .reshape({b, c * ph * pw, f, h, w});
}

torch::Tensor VideoPositions(int64_t frames, int64_t h, int64_t w, int64_t start) {
  const auto i64 = torch::kInt64;
  const torch::Tensor f = torch::arange(frames, i64).view({-1, 1, 1});
  const torch::Tensor r = torch::arange(h, i64).view({1, -1, 1});
  const torch::Tensor c = torch::arange(w, i64).view({1, 1, -1});
  return (start + f * kFrameStride + 1 + r * kRowStride + c).reshape({-1});
}

RopeTables MakeRopeTables(const torch::Tensor& positions, int64_t head_dim, double theta,
                          torch::Device device) {
  const torch::Tensor i = torch::arange(head_dim / 2, torch::kFloat64);
  const torch::Tensor inv_freq = torch::pow(theta, -2.0 * i / static_cast<double>(head_dim));
  const torch::Tensor angle = positions.to(torch::kFloat64).unsqueeze(1) * inv_freq.unsqueeze(0);
  const torch::Tensor cos = torch::cos(angle), sin = torch::sin(angle);
  return {torch::cat({cos, cos}, -1).to(device, torch::kFloat32),
          torch::cat({sin, sin}, -1).to(device, torch::kFloat32)};
}

torch::Tensor ApplyRope(const torch::Tensor& x, const RopeTables& rope) {
  const torch::Tensor xf = x.to(torch::kFloat32);
  const auto halves = xf.chunk(2, -1);
  const torch::Tensor rotated = torch::cat({-halves[1], halves[0]}, -1);
  const torch::Tensor cos = rope.cos.unsqueeze(0).unsqueeze(2);
  const torch::Tensor sin = rope.sin.unsqueeze(0).unsqueeze(2);
  return (xf * cos + rotated * sin).to(x.scalar_type());
}

namespace {

// silu(gate) · up, in one pass on the CPU.
torch::Tensor SiluMul(const torch::Tensor& gate, const torch::Tensor& up) {
  return gate.is_cuda() ? torch::silu(gate) * up : cpu::SiluMul(gate, up);
}

}  // namespace

torch::Tensor SwiGlu(const torch::Tensor& x, const torch::Tensor& a, const torch::Tensor& b,
                     const torch::Tensor& down, const torch::Tensor& residual) {
  const torch::Tensor xd = x.to(a.scalar_type());
  // A layer runs as the experts do (a, b [inner, dim]: its gate and up product is 2·inner wide):
  // where they run on a GEMM of ours (float32 on BLAS's, bf16 on oneDNN's brgemm), without
  // LibTorch's ops, in at least one piece per thread (each piece's GEMM runs on its thread
  // alone), of at most kMoePieceRows rows.
  if (PiecesOnOurGemm(xd, a)) {
    const int64_t tokens = xd.numel() / std::max<int64_t>(xd.size(-1), 1);
    const int64_t threads = std::max<int64_t>(at::get_num_threads(), 1);
    const int64_t piece = std::clamp<int64_t>((tokens + threads - 1) / threads, 1, kMoePieceRows);
    const torch::Tensor rows = xd.reshape({-1, xd.size(-1)});
    const torch::Tensor residual_rows =
        residual.defined() ? residual.reshape({-1, residual.size(-1)}) : residual;
    torch::Tensor out = torch::empty(rows.sizes(), rows.options());
    const int64_t pieces = (rows.size(0) + piece - 1) / piece;
    std::vector<char> done(pieces, 0);
    cpu::RunTasks(pieces, [&](int64_t i) {
      const int64_t first = i * piece;
      done[i] = cpu::SwiGluPieceInto(rows, first, std::min(piece, rows.size(0) - first), a, b, down,
                                     out, residual_rows);
    });
    if (std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) {
      return out.view(xd.sizes());
    }
  }
  return Linear(SiluMul(Linear(xd, a, {}), Linear(xd, b, {})), down, {}, residual);
}

namespace {

// One SwiGLU expert's gated hidden rows silu(x·gate)·(x·up), from fused [dim, 2·inner] gate_up
// weights (gate first, up second); `keep_float32` as MatmulWeight's.
torch::Tensor ExpertHidden(const torch::Tensor& x, const torch::Tensor& gate_up,
                           bool keep_float32 = false) {
  const auto gu = MatmulWeight(x, gate_up, keep_float32).chunk(2, -1);
  return SiluMul(gu[0], gu[1]);
}

// One SwiGLU expert: its hidden rows through `down`.
torch::Tensor FusedExpert(const torch::Tensor& x, const torch::Tensor& gate_up,
                          const torch::Tensor& down) {
  return MatmulWeight(ExpertHidden(x, gate_up), down);
}

// FusedExpert written into `out` (rows of a larger tensor): straight from the GEMM where out has
// the weights' dtype and the matmul runs in it, else through a copy. A float32 `out` keeps the
// hidden rows in float32 where the GEMMs run in float32 anyway.
void FusedExpertInto(const torch::Tensor& x, const torch::Tensor& gate_up,
                     const torch::Tensor& down, torch::Tensor out) {
  const bool keep_float32 = out.scalar_type() == torch::kFloat32;
  const torch::Tensor h = ExpertHidden(x, gate_up, keep_float32);
  if (out.scalar_type() == down.scalar_type() && !GemmInFloat32(h, down)) {
    torch::mm_out(out, h, down);
  } else {
    out.copy_(MatmulWeight(h, down, keep_float32));
  }
}

// The routing of one MoE block: each token's top_k experts and their combine weights, and the
// (token, slot) pairs sorted by expert so that each expert's pairs are one contiguous slice.
struct Routing {
  torch::Tensor weights;         // float32 [N, top_k]: combine weights, in slot order
  torch::Tensor sorted_experts;  // int64 [N·top_k]: the sorted pairs' experts, ascending
  torch::Tensor order;           // int64 [N·top_k]: each sorted pair's index token·top_k + slot
  torch::Tensor routed_x;        // [N·top_k, dim]: each sorted pair's token row
};

Routing Route(const torch::Tensor& xs, const MoeWeights& w, int64_t top_k, double routed_scale) {
  const torch::Tensor scores =
      torch::sigmoid(torch::matmul(xs.to(torch::kFloat32), w.router.to(torch::kFloat32).t()));
  const torch::Tensor chosen = std::get<1>(torch::topk(scores + w.expert_bias, top_k, -1));
  torch::Tensor weights = scores.gather(-1, chosen);
  weights = weights / weights.sum(-1, /*keepdim=*/true) * routed_scale;
  auto [sorted, order] = chosen.flatten().sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  torch::Tensor routed_x = xs.index_select(0, torch::div(order, top_k, "floor"));
  return {weights, sorted, order, routed_x};
}

// Adds the routed experts into `out` (float32 [N, dim]), one at a time over their slices of the
// expert-sorted pairs, on CUDA: the slice lengths are read on the host, a device sync.
void LoopExperts(const Routing& r, const MoeWeights& w, int64_t top_k, torch::Tensor& out) {
  const torch::Tensor counts =
      torch::bincount(r.sorted_experts, /*weights=*/{}, w.gate_up.size(0)).to(torch::kCPU);
  const torch::Tensor tokens = torch::div(r.order, top_k, "floor");
  const torch::Tensor weights = r.weights.flatten().index_select(0, r.order);
  int64_t begin = 0;
  for (int64_t e = 0; e < counts.numel(); ++e) {
    const int64_t n = counts.data_ptr<int64_t>()[e];
    if (n == 0) continue;
    const torch::Tensor y = FusedExpert(r.routed_x.narrow(0, begin, n), w.gate_up[e], w.down[e]);
    out.index_add_(0, tokens.narrow(0, begin, n),
                   weights.narrow(0, begin, n).unsqueeze(1) * y.to(torch::kFloat32));
    begin += n;
  }
}

// The CPU's MoE after routing, as float32 [N, dim]: the shared expert over every token and each
// routed expert over its slice of the expert-sorted pairs (r), cut into pieces of at most
// kMoePieceRows rows that the intra-op threads take, largest first, one piece per thread at a
// time: its token rows gathered, its matmuls and gate on that thread alone. Run one expert after
// another, each matmul split across the threads, a small expert's matmul left one thread waiting
// (2 threads: 1.3-1.8x one at 143-2300 rows); gathering every pair's rows up front ran on one
// thread (the profiler: 0.9 ms of a bench small B8 step). The routed outputs are then added in
// expert order, as LoopExperts does.
torch::Tensor ExpertPiecesOnCpu(const torch::Tensor& xs, const cpu::ExpertRoutes& r,
                                const MoeWeights& w, const torch::Tensor& residual) {
  struct Piece {
    int64_t expert;  // -1: the shared expert, over tokens; else over the pairs' slice
    int64_t begin, rows;
  };
  // Where the experts' GEMMs run in float32 anyway (16-bit weights on a CPU whose 16-bit GEMM is
  // the slower), the pieces stay in float32: the tokens converted once, not once per expert that
  // reads them, and the hidden rows and routed outputs never rounded to the weights' dtype (each
  // round trip a pass of its own).
  const torch::Tensor x = GemmInFloat32(xs, w.shared_gate_up) ? xs.to(torch::kFloat32) : xs;
  std::vector<Piece> pieces;
  // An expert's pieces run on a GEMM of ours without LibTorch's ops where cpu::ExpertPieceInto
  // takes them (float32 on BLAS's, bf16 on oneDNN's brgemm); others (a model computed in float32
  // from 16-bit weights, a bf16 one on a CPU without brgemm's bf16) through LibTorch's ops
  // (FusedExpertInto).
  auto cut = [&pieces](int64_t expert, int64_t begin, int64_t rows) {
    for (int64_t b = begin; b < begin + rows; b += kMoePieceRows) {
      pieces.push_back({expert, b, std::min(kMoePieceRows, begin + rows - b)});
    }
  };
  cut(-1, 0, xs.size(0));
  int64_t begin = 0;
  for (int64_t e = 0; e < static_cast<int64_t>(r.counts.size()); ++e) {
    cut(e, begin, r.counts[e]);
    begin += r.counts[e];
  }
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.rows > b.rows; });
  torch::Tensor out = torch::empty({xs.size(0), xs.size(1)}, xs.options().dtype(torch::kFloat32));
  torch::Tensor routed = torch::empty({r.tokens.size(0), xs.size(1)}, x.options());
  const int64_t* tokens = r.tokens.const_data_ptr<int64_t>();
  cpu::RunTasks(static_cast<int64_t>(pieces.size()), [&](int64_t i) {
    const Piece& p = pieces[i];
    if (p.expert < 0) {
      if (cpu::ExpertPieceInto(x, nullptr, p.begin, p.rows, w.shared_gate_up, w.shared_down, -1,
                               out, p.begin)) {
        return;
      }
      FusedExpertInto(x.narrow(0, p.begin, p.rows), w.shared_gate_up, w.shared_down,
                      out.narrow(0, p.begin, p.rows));
    } else {
      if (cpu::ExpertPieceInto(x, tokens + p.begin, 0, p.rows, w.gate_up, w.down, p.expert, routed,
                               p.begin)) {
        return;
      }
      FusedExpertInto(x.index_select(0, r.tokens.narrow(0, p.begin, p.rows)), w.gate_up[p.expert],
                      w.down[p.expert], routed.narrow(0, p.begin, p.rows));
    }
  });
  return cpu::AddRoutedRows(out, r, routed, residual);
}

// The routed experts as two grouped matmuls over all slices: float32 [N, dim]. Every shape is
// fixed by N, top_k and the weights; the slices' ends are found on the device.
torch::Tensor GroupedExperts(const Routing& r, const MoeWeights& w, int64_t top_k) {
  const torch::Tensor experts = torch::arange(w.gate_up.size(0), r.sorted_experts.options());
  // End of each expert's slice (an expert with no pair ends where the previous one does).
  const torch::Tensor ends =
      torch::searchsorted(r.sorted_experts, experts, /*out_int32=*/true, /*right=*/true);
  const auto gu = at::_grouped_mm(r.routed_x, w.gate_up, ends).chunk(2, -1);
  const torch::Tensor y = at::_grouped_mm(SiluMul(gu[0], gu[1]), w.down, ends);
  // Back to (token, slot) order by the permutation (each row written once, so deterministic,
  // unlike an atomic scatter-add: a graph replay equals eager bit for bit), then the weighted sum.
  const int64_t n = r.weights.size(0), dim = y.size(1);
  const torch::Tensor pairs =
      torch::empty({n * top_k, dim}, y.options()).index_copy_(0, r.order, y);
  return (pairs.view({n, top_k, dim}).to(torch::kFloat32) * r.weights.unsqueeze(-1)).sum(1);
}

// Whether `t`, an operand of at::_grouped_mm, passes GroupedMMUtils.h's
// check_valid_strides_and_return_transposed: one of its last two strides 1, the other at least the
// extent it strides over and a multiple of 16 bytes; its address 16-byte aligned (the pointer's
// value, read on the host: no device access).
bool GroupedOperandAligned(const torch::Tensor& t) {
  const int64_t d = t.dim(), unit = 16 / static_cast<int64_t>(t.element_size());
  const int64_t rows = t.stride(d - 2), cols = t.stride(d - 1);
  const bool row_major =
      cols == 1 && rows >= std::max<int64_t>(1, t.size(d - 1)) && rows % unit == 0;
  const bool col_major =
      rows == 1 && cols >= std::max<int64_t>(1, t.size(d - 2)) && cols % unit == 0;
  return (row_major || col_major) && reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0;
}

// The compute capability major of the CUDA device `d`; 0 in a build that links LibTorch's CPU
// half only (the fuzz build, tests/fuzz), where no CUDA tensor exists.
int CudaMajor(const torch::Device& d) {
#if defined(PRAXIS_TORCH_CPU_ONLY)
  (void)d;
  return 0;
#else
  return at::cuda::getDeviceProperties(d.has_index() ? d.index() : at::cuda::current_device())
      ->major;
#endif
}

}  // namespace

bool GroupedMoeIsSyncFree(const torch::Tensor& x, const MoeWeights& w, int cuda_major) {
  // PyTorch 2.11, aten/src/ATen/native/cuda/GroupedBlas.cpp, _grouped_mm_cuda: the fast path
  // (at::cuda::detail::bf16bf16_grouped_mm, GroupMM.cu) needs bf16 operands and output on a device
  // of major 9 or 10 (_scaled_mm_allowed_device(sm90_only, sm100_only)); anything else runs
  // _grouped_mm_fallback (GroupedMMUtils.h), which copies the offsets to the host.
  if (cuda_major != 9 && cuda_major != 10) return false;
  const auto bf16 = torch::kBFloat16;
  if (w.gate_up.scalar_type() != bf16 || w.down.scalar_type() != bf16) return false;
  // GroupMM.cu: "Can't process more than 1024 groups".
  if (w.gate_up.dim() != 3 || w.down.dim() != 3 || w.gate_up.size(0) >= 1024) return false;
  // The activations Moe passes are fresh row-major tensors (x cast to bf16, gathered; the gated
  // hidden [rows, expert_dim]): aligned when their row lengths are multiples of 8 bf16 elements.
  const int64_t dim = x.size(-1), expert_dim = w.down.size(1);
  return dim % 8 == 0 && expert_dim % 8 == 0 && GroupedOperandAligned(w.gate_up) &&
         GroupedOperandAligned(w.down);
}

MoeDispatch AutoMoeDispatch(const torch::Tensor& x, const MoeWeights& w) {
  // On CUDA where the fused kernel does not apply (e.g. float32 weights, or a GPU before sm90),
  // the loop's host read of the counts stays: a forward with such a block cannot be captured in
  // a CUDA graph and runs eager (docs/model.md). The CPU keeps the loop: measured, and its
  // grouped matmul is itself the same per-group loop.
  if (!x.is_cuda()) return MoeDispatch::kLoop;
  return GroupedMoeIsSyncFree(x, w, CudaMajor(x.device())) ? MoeDispatch::kGrouped
                                                           : MoeDispatch::kLoop;
}

torch::Tensor Moe(const torch::Tensor& x, const MoeWeights& w, int64_t top_k, double routed_scale,
                  MoeDispatch dispatch, const torch::Tensor& residual) {
  const torch::ScalarType dt = w.gate_up.scalar_type();
  const torch::Tensor xs = x.reshape({-1, x.size(-1)}).to(dt);
  if (dispatch == MoeDispatch::kAuto) dispatch = AutoMoeDispatch(xs, w);
  torch::Tensor out;
  if (!xs.is_cuda() && dispatch == MoeDispatch::kLoop) {
    // The CPU routes in one pass (top-k, weights and the expert sort) instead of ~15 small ops,
    // and adds the residual as it combines the experts' rows.
    const cpu::ExpertRoutes r =
        cpu::RouteTopK(cpu::RouterLogits(xs, w.router), w.expert_bias, top_k, routed_scale);
    if (residual.defined()) {
      return ExpertPiecesOnCpu(xs, r, w, residual.reshape({-1, residual.size(-1)}))
          .view(residual.sizes());
    }
    out = ExpertPiecesOnCpu(xs, r, w, {});
  } else {
    // The shared expert's float32 output, a fresh tensor, is the sum the routed experts add into.
    out = FusedExpert(xs, w.shared_gate_up, w.shared_down).to(torch::kFloat32);
    const Routing routing = Route(xs, w, top_k, routed_scale);
    if (dispatch == MoeDispatch::kGrouped) {
      out = out + GroupedExperts(routing, w, top_k);
    } else {
      LoopExperts(routing, w, top_k, out);
    }
  }
  const torch::Tensor moe = out.to(dt).view(x.sizes());
  return residual.defined() ? residual + moe : moe;
}

}  // namespace praxis::model
