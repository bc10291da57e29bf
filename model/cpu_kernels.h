#pragma once

// Fused CPU kernels for the memory-bound steps of a block: each reads its input once and writes
// its output once, where the same math as ATen ops takes five to eight passes (and on small
// layouts most of a step's time). Float32 arithmetic whatever the storage dtype, as SPEC §5 asks.
// Stateless and thread-safe; they run on LibTorch's intra-op threads (at::parallel_for).

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

namespace praxis::model::cpu {

// The instructions an attention kernel takes: AVX-512 where the CPU has it (kAvx512; kBest may
// take more, see TileAttention), or plain loops (kPortable, what a CPU without AVX-512 runs).
// Tests compare every one.
enum class AttentionIsa : int8_t { kBest = 0, kPortable = 1, kAvx512 = 2 };

// The largest |x| of a CPU tensor (float32, bfloat16 or float16; any strides), in one pass:
// +inf if a value is infinite, else NaN if one is NaN; 0 for an empty tensor. Serves the request
// checks (finite values, the server's magnitude limit), which ran as several ATen ops per input
// on the request thread, on the step's critical path. Thread-safe.
double MaxAbs(const torch::Tensor& x);

// x · rsqrt(mean(x²) + eps) · weight over the last dimension. x: a CPU float tensor (float32,
// bfloat16 or float16) of any shape; weight: float32 [x.size(-1)], the model's (1 + w) already
// multiplied by any block scale. Returns a contiguous tensor of x's shape and dtype.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// Query or key heads into the layout attention reads: x [B, T, H, hd] (any strides, last one 1)
// is RMS-normalised over hd with `weight` (float32 [hd], the (1 + w); skipped when undefined),
// rotated with the rotate-half tables cos, sin (float32 [T, hd]) and written as a contiguous
// [B, H, T, hd] tensor of x's dtype. Float32 heads are read and written in place (no row copies).
torch::Tensor NormRopeHeads(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                            const torch::Tensor& cos, const torch::Tensor& sin,
                            AttentionIsa isa = AttentionIsa::kBest);

// shift + x · scale in float32, rounded to x's dtype: the time modulation of video tokens, in one
// pass. x: a CPU float tensor, any strides; shift, scale: float32, broadcastable to x without
// broadcasting its last dimension (one per chunk or per coarse-grid token, never copied out to
// x's shape). Returns a contiguous tensor of x's shape and dtype; with `out` (x's sizes and dtype,
// unit-stride rows: a slice of a token sequence) writes it there and returns it, so that a
// sequence's modulated tokens need no concatenation pass.
torch::Tensor Modulate(const torch::Tensor& x, const torch::Tensor& shift,
                       const torch::Tensor& scale, const torch::Tensor& out = {});

// 0.5·cos(2π(t·freqs + phases)) for flow times t (a CPU float tensor [...], any strides) and
// float32 freqs, phases [d], in float32 rounded once to `dtype`: the time embedding's Fourier
// features, already in its projection's dtype, in one pass where ATen ops take seven dispatches
// for a few hundred values (a B1 step has three such). Returns contiguous [..., d].
torch::Tensor FourierFeatures(const torch::Tensor& t, const torch::Tensor& freqs,
                              const torch::Tensor& phases, torch::ScalarType dtype);

// The time modulation's shift and 1 + scale in float32, from its projection's output mod
// [..., 2·dim] (a CPU float tensor, unit-stride rows) whose halves they are: one pass where a
// split, two conversions and an add took four dispatches. Returns two contiguous [..., dim].
std::pair<torch::Tensor, torch::Tensor> ShiftAndScale(const torch::Tensor& mod);

// silu(a) · b elementwise (the SwiGLU gate), read and written in one pass: a, b CPU tensors of one
// shape and dtype, any strides (the gate and up halves of one projection are served as views).
// Returns a contiguous tensor of that shape and dtype.
torch::Tensor SiluMul(const torch::Tensor& a, const torch::Tensor& b);

// Runs task(0) … task(count - 1) on the intra-op threads, each task on one thread, taken in
// index order from a shared counter as threads come free (so put the longest first): for work
// whose pieces differ in cost, where at::parallel_for's equal ranges would leave a thread
// waiting. A task's own LibTorch calls run single-threaded. Rethrows a task's exception after
// the others finish; runs inline when called from a parallel region or with one thread.
void RunTasks(int64_t count, const std::function<void(int64_t)>& task);

// The MoE router's logits x · routerᵀ in float32, read from x's rows in their own dtype (the
// reference's float32 matmul of the same values, without a float32 copy of the tokens). x: CPU
// [N, dim], any float dtype and strides; router: [E, dim]. Returns contiguous float32 [N, E].
torch::Tensor RouterLogits(const torch::Tensor& x, const torch::Tensor& router);

// The MoE's routing in one pass over the router logits (float32 [N, E]): each token's top_k
// experts by sigmoid(logit) + bias (float32 [E]; ties to the lower expert, NaN above all, as
// torch::topk), their combine weights (the chosen sigmoids over their sum, times routed_scale),
// and the (token, slot) pairs sorted stably by expert, so that each expert's pairs are one slice.
struct ExpertRoutes {
  torch::Tensor tokens;         // int64 [N·top_k]: each pair's token, expert by expert
  torch::Tensor weights;        // float32 [N·top_k]: each pair's combine weight
  std::vector<int64_t> counts;  // [E]: each expert's pairs, the lengths of its slice
  // [N·top_k]: token t's pairs' places in that order, ascending (expert order) from t·top_k
  std::vector<int64_t> places;
  int64_t top_k = 0;
};
ExpertRoutes RouteTopK(const torch::Tensor& logits, const torch::Tensor& bias, int64_t top_k,
                       double routed_scale);

// out[t] += Σ weights[p] · y[p] over token t's pairs p in expert order (r.places), for every
// token: the routed experts' outputs y [N·top_k, d] (rows in r's expert-sorted order, any float
// dtype, unit-stride rows) combined into the MoE's float32 sum out (contiguous [N, d]), in the
// order adding one expert after another gives, the tokens split across the threads. Returns out;
// with a `residual` ([N, d], any float dtype, unit-stride rows) returns residual + out instead, a
// new contiguous tensor of residual's dtype made in the same pass (each row rounded once: the
// block's residual add without a pass, and a rounding, of its own).
torch::Tensor AddRoutedRows(torch::Tensor& out, const ExpertRoutes& r, const torch::Tensor& y,
                            const torch::Tensor& residual = {});

// One layout's attention as TileAttention walks it: query tiles of consecutive rows that attend
// the same keys, and for each the runs of keys it attends (segments of at most kMaxSegmentTokens
// keys), each with a mask where a key it covers, or its lane padding, is not attended. Built once
// per layout with the plan (model/attention.cc); immutable after, so shared by every thread.
struct AttentionTiles {
  struct Segment {
    int64_t start = 0;     // first key token: even (the bf16 brgemm reads keys in pairs)
    int64_t length = 0;    // keys
    int64_t mask_at = -1;  // offset of its mask in `masks`, or -1: every pair allowed
  };
  // A segment's mask: one row of MaskRow(length) bytes that every query row of its tile shares,
  // 1 = allowed, 0 past `length`.
  static constexpr int64_t kMaskAlign = 16;
  static int64_t MaskRow(int64_t length) {
    return (length + kMaskAlign - 1) / kMaskAlign * kMaskAlign;
  }
  // Measured at the bench layout: at stop 23 (bf16, matrix units) 256 keys 376-389 ms of
  // attention, 512 434-439, 128 456-462, the float32 FMAs level; once the softmax's exp had become
  // cheaper (stop 45), 512 against 256, whole steps in turns: bf16 0.937, 0.941, float32 0.948,
  // bench medium B8 bf16 1.011.
  static constexpr int64_t kMaxSegmentTokens = 512;

  int64_t block = 0;  // the most query rows of a tile
  int64_t q_len = 0, kv_len = 0;
  std::vector<int64_t> rows;   // [query tiles + 1]: tile i is query rows [rows[i], rows[i+1])
  std::vector<int64_t> first;  // [query tiles + 1]: tile i's segments are [first[i], first[i+1])
  std::vector<Segment> segments;
  std::vector<uint8_t> masks;
  int64_t nbytes() const;
};

// softmax(q·kᵀ·scale)·v over the allowed pairs of `tiles` only: one pass per query row block over
// its key tiles with an online softmax in float32. q [B, H, T, hd], k, v [B, kvH, T, hd] (kvH
// divides H; kv head j serves query heads j·H/kvH …), any float dtype, last stride 1; scale > 0.
// Returns [B, H, T, hd] of q's dtype; a row with no allowed key is 0. With `gate` (logits
// [B, T, H] of q's dtype, any strides; `gate_bias`, float32 [H], added to them, or none) returns
// GateHeads(that, gate, gate_bias) instead, gated as it is stored. The two products run as float32
// FMAs in AVX-512 (kAvx512), or plain loops (kPortable); kBest runs bf16 heads of
// kBf16BrgemmMinHeadDim and wider on oneDNN's bf16 brgemm where the CPU has it (HasBf16Brgemm; the
// probabilities are then rounded to bf16 before p·v, as LibTorch's flash kernel does).
torch::Tensor TileAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const AttentionTiles& tiles, double scale,
                            AttentionIsa isa = AttentionIsa::kBest, const torch::Tensor& gate = {},
                            const torch::Tensor& gate_bias = {});

// The most query rows of a tile TileAttention runs best on, for heads of `dtype` and `head_dim`:
// 32 on float32 FMAs, 64 on the bf16 brgemm (its products measured best on 64-128-row tasks on
// AMX, stop 23). Thread-safe.
int64_t TileAttentionRows(torch::ScalarType dtype, int64_t head_dim);

// bf16 heads at least this wide take the bf16 brgemm in TileAttention where the CPU has it. AMX's
// products are 32 deep, so a head of 16 pads q·kᵀ to twice its depth; at stop 23 that made the
// tiny config's medium step 1.08x float32 FMAs' time, and once the softmax's exp had become
// cheaper, 0.77x (B8) and 0.85x (B1); on Zen 4's AVX512-BF16, 0.75x (B8) (docs/benchmarks.md,
// stops 45 and 46). Narrower heads: not measured.
inline constexpr int64_t kBf16BrgemmMinHeadDim = 16;

// float16 heads up to this width run TileAttention's float32 FMAs; wider ones LibTorch's flash
// kernel, which at a narrow head spends as much on per-block work as on its products (measured:
// tiny config, head dim 16, docs/benchmarks.md stop 22).
inline constexpr int64_t kNarrowHeadDim = 32;

// Whether LibTorch's brgemm (oneDNN's ukernel, as LibTorch's flash kernel calls it) multiplies
// VNNI-packed bf16 here on bf16 units — AMX tiles or AVX512-BF16 dot products — checked once on a
// small known product; TileAttention then takes it for bf16 (kBest), and ExpertPieceInto /
// SwiGluPieceInto for bf16 pieces. The environment variable PRAXIS_BF16_BRGEMM=0, read once, turns
// it off for A/B runs. Thread-safe.
bool HasBf16Brgemm();

// The gated attention output, in one pass: out[b, t, h·hd + i] = o[b, h, t, i] · sigmoid(gate[b, t,
// h] + gate_bias[h]). o: CPU [B, H, T, hd], any strides with the last 1; gate: [B, T, H] logits of
// o's dtype, any strides (sliced from the stacked projection; the sigmoid is taken in float32);
// gate_bias: float32 [H], or none (0). Returns a contiguous [B, T, H·hd] of o's dtype.
torch::Tensor GateHeads(const torch::Tensor& o, const torch::Tensor& gate,
                        const torch::Tensor& gate_bias = {});

// x · w (+ b) by the float32 GEMM for a bf16 / fp16 weight `w` [in, out] (any strides: a Linear
// passes its weight transposed), on float32 copies of w and b made at their first call and kept
// while their storage lives. Products of 16-bit values are exact in float32 and the sums float32,
// as in LibTorch's own 16-bit GEMM; only the order of the sums differs. A weight whose copy would
// not fit in SetFloat32WeightBudget's bytes runs on LibTorch's 16-bit GEMM instead. x [..., in],
// any float dtype; returns [..., out] in `out` (default: w's dtype; float32 spares a caller that
// goes on in float32 the round trip). For CPUs where that GEMM is the slower one
// (model::ReducedGemmInFloat32). Thread-safe.
torch::Tensor MatmulViaFloat32(const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b = {},
                               std::optional<torch::ScalarType> out = std::nullopt);

// The shortest of `runs` timed calls of `run`, in seconds, after one untimed warm-up call (where
// oneDNN builds its kernel and MKL its buffers): what the CPU probes compare. Thread-safe as `run`.
double BestSeconds(int runs, const std::function<void()>& run);

// Whether ExpertPieceInto / SwiGluPieceInto take float32 pieces: libtorch_cpu exports BLAS's
// float GEMM (sgemm_). Thread-safe.
bool Float32PiecesOnBlas();

// Whether a float32 piece's products with weights whose rows are [K, N] (the experts'; a dense
// layer's Linear weights where VideoBackbone::Create lays them out so) run on LibTorch's brgemm
// (oneDNN's ukernel, AVX-512) instead of BLAS's sgemm: measured on Zen 4 at the bench config's
// piece shapes on one thread, 1.1-1.3x MKL's sgemm. Checked once on a small known product;
// PRAXIS_FLOAT32_BRGEMM=0, read once, turns it off for A/B runs. Thread-safe.
bool HasFloat32Brgemm();

// residual + x · wᵀ + b (residual and b optional) for a Linear on oneDNN's brgemm, its rows (and
// where they are few, its columns) cut into tasks the intra-op threads take (RunTasks), read in
// place where they fold into runs of one stride (a narrowed or batched view; x [..., K],
// unit-stride rows), else copied into rows first (video tokens read channel-major: LibTorch's
// strided batched GEMM took 0.57 ms of a bench small float32 B8 step). The residual ([..., N] of
// x's dtype) and the bias are C's first rows, which the product adds onto: a block's residual add
// without a pass of its own. float32 where HasFloat32Brgemm and w [N, K] is laid out column-major
// (its transpose's [K, N] rows, as VideoBackbone::Create lays a float32 model's Linear weights out
// there); bf16 where HasBf16Brgemm over w's packed copy (PackForBrgemm's, made at load), the
// float32 sums (residual and bias included) rounded once. On Zen 4 LibTorch's float32 linear (MKL's
// two-thread GEMM) ran the bench config's projections ([1824, 128]·[128, 258]) at ~50 GFLOP/s a
// thread, brgemm at ~110. Returns a contiguous [..., N] of x's dtype; undefined where it does not
// take the product (another dtype, an unpacked bf16 weight, a residual of other sizes).
// Thread-safe.
torch::Tensor BrgemmLinear(const torch::Tensor& x, const torch::Tensor& w,
                           const torch::Tensor& b = {}, const torch::Tensor& residual = {});

// One SwiGLU expert over a piece of token rows on a GEMM of ours, without a LibTorch op: a piece
// of the CPU's MoE made ~25 of them (~15 us at a robot's small layout) around its two products.
// The rows are x's [first, first + count) (rows null) or rows[0..count) (each in [0, N)), of x
// [N, dim] (unit-stride rows); the weights gate_up [dim, 2·inner] and down [inner, dim], or expert
// `expert` (>= 0) of [E, dim, 2·inner] and [E, inner, dim] stacks, read row-major or as a
// transpose's rows, of x's dtype. bf16 (where HasBf16Brgemm, on oneDNN's brgemm, with the weights
// PackForBrgemm packed): silu(gate) · up is computed in float32 from the first product's sums and
// rounded to bf16 once, as the second's operand (LibTorch's path rounds each product and the
// gate). float32 (where Float32PiecesOnBlas; on oneDNN's brgemm where HasFloat32Brgemm and the
// weight's rows are [K, N], else libtorch_cpu's sgemm_, MKL's, which LibTorch's float matmul
// calls): the hidden rows stay in the products' buffer. Both products recorded as "praxis::brgemm"
// or "praxis::sgemm" (inputs x, w). Writes out's rows [out_first, out_first + count) (float32, or
// bf16 for bf16 x; [M, dim], unit-stride rows) and returns true; returns false, writing nothing,
// where it does not take the piece (bf16 weights not packed, other forms or dtypes). Called
// inside a parallel region, runs on the calling thread alone (MKL's nested threading is off
// there); thread-safe.
bool ExpertPieceInto(const torch::Tensor& x, const int64_t* rows, int64_t first, int64_t count,
                     const torch::Tensor& gate_up, const torch::Tensor& down, int64_t expert,
                     torch::Tensor& out, int64_t out_first);

// ExpertPieceInto for a dense SwiGLU layer's rows [first, first + count) of x: Linear weights a
// (gate) and b (up) [inner, dim] and down [dim, inner], out's same rows written; with `residual`
// (out's sizes and dtype, unit-stride rows), its same rows plus the layer's (the down product
// added onto them: the block's residual add without a pass of its own). Thread-safe.
bool SwiGluPieceInto(const torch::Tensor& x, int64_t first, int64_t count, const torch::Tensor& a,
                     const torch::Tensor& b, const torch::Tensor& down, torch::Tensor& out,
                     const torch::Tensor& residual = {});

// A bf16 SwiGLU weight as ExpertPieceInto / SwiGluPieceInto are given it: an [E, K, N] expert
// stack or a [K, N] weight, or with `linear` a Linear's [N, K] weight.
struct BrgemmWeight {
  torch::Tensor w;
  bool linear = false;
};

// Packs `weights` into oneDNN's VNNI layout for the bf16 pieces' brgemm, all or none, kept while
// each weight's storage lives and counted against SetFloat32WeightBudget's bytes. Returns whether
// all are packed (false, none made: over the budget, no bf16 brgemm here, a weight not bf16 on
// the CPU or with an odd K). VideoBackbone::Create packs a bf16 CPU model's at load, so that
// whether a piece takes brgemm (and its numerics) depends on the model alone, never on which
// experts earlier requests reached. Thread-safe.
bool PackForBrgemm(const std::vector<BrgemmWeight>& weights);

// The most bytes of float32 weights for 16-bit models, all models together (default 1 GiB, the
// server's --max_float32_weight_bytes): MatmulViaFloat32's copies (float32's memory on top of the
// 16-bit weights) and the Float32WeightHolds of models converted at load (in place of them); the
// bf16 weights PackForBrgemm packs count too (their bytes on top of the weights).
// Copies and holds already made stay. Thread-safe.
void SetFloat32WeightBudget(int64_t bytes);

// Bytes of float32 weights counted against SetFloat32WeightBudget's budget beside
// MatmulViaFloat32's copies, for as long as the hold lives: a 16-bit model converted to float32
// at load holds its float32 bytes. Move-only; its destructor gives the bytes back (thread-safe).
class Float32WeightHold {
 public:
  Float32WeightHold(Float32WeightHold&& other) noexcept : bytes_(std::exchange(other.bytes_, 0)) {}
  Float32WeightHold& operator=(Float32WeightHold&& other) noexcept {
    std::swap(bytes_, other.bytes_);  // `other` gives back what this held
    return *this;
  }
  ~Float32WeightHold();

 private:
  friend std::optional<Float32WeightHold> HoldFloat32WeightBytes(int64_t bytes);
  explicit Float32WeightHold(int64_t bytes) : bytes_(bytes) {}
  int64_t bytes_;
};

// A hold of `bytes`, or nullopt when they do not fit beside the copies and the other holds.
// Thread-safe.
std::optional<Float32WeightHold> HoldFloat32WeightBytes(int64_t bytes);

}  // namespace praxis::model::cpu
