#include "model/attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "model/cpu_kernels.h"

namespace praxis::model {
namespace {

// One past the last token of tile `tile` of edge `block_size` in a sequence of `length` tokens (a
// ragged last tile ends with the sequence).
int64_t TileEnd(int64_t tile, int64_t block_size, int64_t length) {
  return std::min(length, (tile + 1) * block_size);
}

// Token indices of the tiles `tiles` of edge `block_size` in a sequence of `length` tokens.
torch::Tensor TileTokens(const std::vector<int32_t>& tiles, int64_t block_size, int64_t length) {
  std::vector<torch::Tensor> parts;
  for (int32_t t : tiles) {
    parts.push_back(torch::arange(t * block_size, TileEnd(t, block_size, length), torch::kInt64));
  }
  return parts.empty() ? torch::empty({0}, torch::kInt64) : torch::cat(parts);
}

// `index` as one run when its values are consecutive; a run of length 0 otherwise.
TokenRun AsRun(const torch::Tensor& index) {
  const int64_t n = index.numel();
  if (n == 0) return {};
  const int64_t* v = index.data_ptr<int64_t>();
  return v[n - 1] - v[0] == n - 1 ? TokenRun{v[0], n} : TokenRun{};
}

// Rows `index` of dimension 2 of t [B, H, T, hd]: a view where they form one run.
torch::Tensor Gather(const torch::Tensor& t, const torch::Tensor& index, const TokenRun& run) {
  return run.length > 0 ? t.narrow(2, run.start, run.length) : t.index_select(2, index);
}

// One fused call attends every pair beats the groups' calls when it does less work; each group
// call costs about as much as this many query-key pairs of one row beyond its own pairs (its
// gathers, a second kernel for partial tiles, the merge and the scatter: ~15 small ops).
constexpr int64_t kGroupCallPairs = 16384;
// A dense bias is kept only for layouts this short ([T, T] in the attention dtype).
constexpr int64_t kMaxDenseBiasBytes = int64_t{16} << 20;
}  // namespace

// LibTorch's flash kernel at head dims up to 32 is bound by its softmax and per-block work, not by
// its GEMMs; in float32 up to 64 its GEMMs are FMAs like ours. There TileAttention wins, also by
// skipping the empty tiles. In bf16 above 32 the flash kernel's AMX GEMMs beat our float32 FMAs
// (stop 22), so TileAttention runs there only because it takes oneDNN's bf16 brgemm too (AMX, stop
// 23; AVX512-BF16 on Zen 4, stop 46). Where LibTorch's brgemm takes no bf16 the flash kernel's
// bf16 GEMMs are no faster than FMAs or slower (a Xeon without AMX: 39 ms of a bench medium step
// against 22 ms here, stop 26), so bf16 follows float32. Measured in docs/benchmarks.md.
int64_t TileAttentionMaxHeadDim(torch::ScalarType dtype) {
  static const char* const env = std::getenv("PRAXIS_TILE_ATTENTION_MAX_HEAD_DIM");
  if (env != nullptr) return std::atoll(env);
  if (dtype == torch::kBFloat16) return cpu::HasBf16Brgemm() ? 256 : 64;
  return dtype == torch::kFloat32 ? 64 : cpu::kNarrowHeadDim;
}

namespace {

// Bias rows on CUDA are padded to this many elements (16: the alignment SDPA pads to).
constexpr int64_t kBiasRowAlign = 16;

std::vector<int32_t> RowTiles(const torch::Tensor& counts, const torch::Tensor& indices,
                              int64_t i) {
  const int32_t n = counts[i].item<int32_t>();
  const torch::Tensor row = indices[i].slice(0, 0, n).contiguous();
  return std::vector<int32_t>(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + n);
}

// softmax attention and its row log-sum-exp (float32 [B, H, rows]) with a fused kernel.
std::pair<torch::Tensor, torch::Tensor> FusedWithLse(const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v, double scale) {
  if (q.is_cuda()) {
    auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
        q, k, v, /*attn_bias=*/{}, /*compute_log_sumexp=*/true, 0.0, false, scale);
    return {out, lse.slice(2, 0, q.size(2)).to(torch::kFloat32)};
  }
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, {}, scale);
  return {out, lse};
}

// Whether the memory-efficient kernel takes the partial tiles of q [B, H, rows, hd] with `bias`.
// PyTorch 2.11: aten/src/ATen/native/transformers/cuda/attention.cu (_efficient_attention_forward)
// wants the bias in q's dtype with a unit last stride, and mem_eff/kernel_forward.h
// (check_supported) its row stride a multiple of the kernel's alignment (BuildAttentionPlan pads
// the rows to 16 elements on CUDA); sdp_utils.cpp (check_head_dim_size_mem_efficient,
// minimum_gemm_alignment) wants the head dim a multiple of 8 for 16-bit types and of 4 for float32
// on sm80+ (k and v share q's head dim here; kvH == H on CUDA).
bool EfficientKernelTakes(const torch::Tensor& q, const torch::Tensor& bias) {
  const torch::ScalarType dt = q.scalar_type();
  if (bias.scalar_type() != dt || bias.stride(-1) != 1) return false;
  if (dt != torch::kBFloat16 && dt != torch::kFloat16 && dt != torch::kFloat32) return false;
  return q.size(-1) % (dt == torch::kFloat32 ? 4 : 8) == 0;
}

// Masked attention over the partial tiles, with its row log-sum-exp (-inf where a row has no
// allowed pair, whose output is 0): the fused kernel with the plan's additive bias (the CPU's
// flash kernel; CUDA's memory-efficient one, the bias broadcast to [B, H, rows, cols] as a view).
// Neither reads device data on the host. Float32 over the materialized mask only where the kernel
// cannot take the operands (EfficientKernelTakes).
std::pair<torch::Tensor, torch::Tensor> MaskedWithLse(const torch::Tensor& q,
                                                      const torch::Tensor& k,
                                                      const torch::Tensor& v,
                                                      const AttentionPlan::Group& g, double scale) {
  const float inf = std::numeric_limits<float>::infinity();
  if (!q.is_cuda() && g.partial_bias.scalar_type() == q.scalar_type()) {
    auto [out, lse] =
        at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false, g.partial_bias, scale);
    // The kernel reports lse 0 (and output 0) for a fully masked row; give it no weight.
    return {out, lse.masked_fill(g.partial_row_any.logical_not(), -inf)};
  }
  if (q.is_cuda() && EfficientKernelTakes(q, g.partial_bias)) {
    const torch::Tensor bias = g.partial_bias.expand(
        {q.size(0), q.size(1), g.partial_bias.size(0), g.partial_bias.size(1)});
    auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
        q, k, v, bias, /*compute_log_sumexp=*/true, 0.0, false, scale);
    // A fully masked row may come back NaN (exp(-inf - -inf)): 0 and -inf by fixed-shape fills.
    const torch::Tensor none = g.partial_row_any.logical_not();
    return {out.masked_fill(none.unsqueeze(-1), 0.0),
            lse.slice(2, 0, q.size(2)).to(torch::kFloat32).masked_fill(none, -inf)};
  }
  const int64_t heads = q.size(1);
  torch::Tensor s = torch::matmul(q.to(torch::kFloat32),
                                  ExpandKvHeads(k, heads).to(torch::kFloat32).transpose(-1, -2));
  s = (s * scale).masked_fill(g.partial_mask.logical_not(), -inf);
  const torch::Tensor lse = torch::logsumexp(s, -1);
  const torch::Tensor safe = torch::where(torch::isinf(lse), torch::zeros_like(lse), lse);
  const torch::Tensor p = torch::exp(s - safe.unsqueeze(-1));
  return {torch::matmul(p, ExpandKvHeads(v, heads).to(torch::kFloat32)), lse};
}

// `allowed` [rows, cols] as an additive 0 / -inf bias in `dtype` on `device`. On CUDA its rows
// are padded to a multiple of kBiasRowAlign elements and the bias is the narrowed view: the
// memory-efficient kernel needs the bias's row stride aligned (SDPA's own preprocess_mask pads the
// same way, attention.cpp pad_bias); the padding is never read.
torch::Tensor AdditiveBias(const torch::Tensor& allowed, torch::Device device,
                           torch::ScalarType dtype) {
  const int64_t cols = allowed.size(1);
  const int64_t padded =
      device.is_cuda() ? (cols + kBiasRowAlign - 1) / kBiasRowAlign * kBiasRowAlign : cols;
  torch::Tensor bias = torch::zeros({allowed.size(0), padded}, torch::kFloat32);
  bias.narrow(1, 0, cols)
      .masked_fill_(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  return bias.to(device, dtype).narrow(1, 0, cols);
}

// Bytes a bias holds, its rows' padding included (the whole allocation of the view).
int64_t HeldBytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

// A query tile's rows where its range allows: whole blocks of the float32 kernel (8 rows) and of
// AMX's tiles (16). Measured: at the bench layout, float32, near-equal tiles (31-32 rows of a
// 1 200-row run) took 1.015x the step of 32-row tiles (stop 51).
constexpr int64_t kTileRowStep = 16;

// TileAttention's tiles from `blocks`, the exact rectangles of allowed pairs (AllowedBlocks): each
// query range (rows that attend the same key ranges; a range of rows that attend none is one too)
// split into tiles of at most `rows` rows, as few as fit and as even as kTileRowStep allows, each
// tile's segments its range's key ranges cut at kMaxSegmentTokens, each from an even key (the bf16
// brgemm reads keys in pairs) and masked (one row every row of the range's tiles shares) where it
// starts before its keys or its lane padding passes them. The pairs computed are the allowed ones
// but for that padding (bench config, small layout: 91 % allowed, against 78-80 % for 32- or 64-row
// tiles of 16-key groups cut from the mask's tiles).
cpu::AttentionTiles BuildTiles(const std::vector<AllowedBlock>& blocks, int64_t q_len,
                               int64_t kv_len, int64_t rows) {
  using Tiles = cpu::AttentionTiles;
  Tiles tiles;
  tiles.q_len = q_len;
  tiles.kv_len = kv_len;
  tiles.rows.push_back(0);
  tiles.first.push_back(0);
  // Query rows [begin, end), attending keys blocks[b0, b1) (none where b0 == b1), as tiles that
  // share the range's segments and their masks.
  auto add_range = [&](int64_t begin, int64_t end, size_t b0, size_t b1) {
    std::vector<Tiles::Segment> segments;
    for (size_t b = b0; b < b1; ++b) {
      const int64_t keys = blocks[b].kv_begin, keys_end = blocks[b].kv_end;
      for (int64_t start = keys / 2 * 2; start < keys_end; start += Tiles::kMaxSegmentTokens) {
        Tiles::Segment seg{.start = start,
                           .length = std::min(Tiles::kMaxSegmentTokens, keys_end - start)};
        const int64_t lead = std::max<int64_t>(keys - start, 0);
        const int64_t row = Tiles::MaskRow(seg.length);
        if (lead > 0 || row != seg.length) {
          seg.mask_at = static_cast<int64_t>(tiles.masks.size());
          tiles.masks.resize(seg.mask_at + row, 0);
          std::fill(tiles.masks.begin() + seg.mask_at + lead,
                    tiles.masks.begin() + seg.mask_at + seg.length, 1);
        }
        segments.push_back(seg);
      }
    }
    const int64_t n = end - begin, parts = (n + rows - 1) / rows;
    const int64_t per_part = (n + parts - 1) / parts;
    const int64_t step = (per_part + kTileRowStep - 1) / kTileRowStep * kTileRowStep;
    for (int64_t tile_begin = begin; tile_begin < end; tile_begin += step) {
      const int64_t tile_end = std::min(end, tile_begin + step);
      tiles.block = std::max(tiles.block, tile_end - tile_begin);
      tiles.segments.insert(tiles.segments.end(), segments.begin(), segments.end());
      tiles.rows.push_back(tile_end);
      tiles.first.push_back(static_cast<int64_t>(tiles.segments.size()));
    }
  };
  for (size_t b0 = 0; b0 < blocks.size();) {
    size_t b1 = b0 + 1;
    while (b1 < blocks.size() && blocks[b1].q_begin == blocks[b0].q_begin) ++b1;
    if (blocks[b0].q_begin > tiles.rows.back()) {
      add_range(tiles.rows.back(), blocks[b0].q_begin, b0, b0);
    }
    add_range(blocks[b0].q_begin, blocks[b0].q_end, b0, b1);
    b0 = b1;
  }
  if (q_len > tiles.rows.back()) add_range(tiles.rows.back(), q_len, 0, 0);
  return tiles;
}

}  // namespace

torch::Tensor ExpandKvHeads(const torch::Tensor& kv, int64_t heads) {
  return kv.size(1) == heads ? kv : kv.repeat_interleave(heads / kv.size(1), 1);
}

bool AttentionPlan::UseDense(int64_t rows) const {
  if (!dense_bias.defined()) return false;
  // Measured: the groups' gathers and merges grow with their rows too, so their pairs count twice.
  const int64_t groups_cost =
      2 * rows * group_pairs + static_cast<int64_t>(groups.size()) * kGroupCallPairs;
  return rows * length * length <= groups_cost;
}

int64_t AttentionPlan::nbytes() const {
  int64_t n = HeldBytes(dense_bias) + tiles.nbytes();
  for (const Group& g : groups) {
    n += g.q_index.nbytes() + g.full_kv_index.nbytes() + g.partial_kv_index.nbytes();
    if (g.partial_mask.defined()) {
      n += g.partial_mask.nbytes() + HeldBytes(g.partial_bias) + g.partial_row_any.nbytes();
    }
  }
  return n;
}

AttentionPlan BuildAttentionPlan(const BlockMask& mask, const MaskRule& rule,
                                 const TokenTags& q_tags, const TokenTags& kv_tags,
                                 torch::Device device, torch::ScalarType dtype, int64_t head_dim) {
  AttentionPlan plan;
  plan.length = mask.q_len;
  if (!device.is_cuda() && head_dim <= TileAttentionMaxHeadDim(dtype)) {
    plan.tiles = BuildTiles(AllowedBlocks(rule, q_tags, kv_tags), mask.q_len, mask.kv_len,
                            cpu::TileAttentionRows(dtype, head_dim));
    return plan;
  }
  using Pattern = std::pair<std::vector<int32_t>, std::vector<int32_t>>;  // (full, partial)
  std::map<Pattern, std::vector<int32_t>> groups;  // ordered: deterministic plans
  for (int64_t i = 0; i < mask.num_q_tiles(); ++i) {
    Pattern p{RowTiles(mask.full_kv_num_blocks, mask.full_kv_indices, i),
              RowTiles(mask.kv_num_blocks, mask.kv_indices, i)};
    if (p.first.empty() && p.second.empty()) continue;  // attends nothing: output stays zero
    groups[std::move(p)].push_back(static_cast<int32_t>(i));
  }
  for (const auto& [pattern, q_tiles] : groups) {
    AttentionPlan::Group g;
    const torch::Tensor q = TileTokens(q_tiles, mask.block_size, mask.q_len);
    const torch::Tensor full = TileTokens(pattern.first, mask.block_size, mask.kv_len);
    const torch::Tensor partial = TileTokens(pattern.second, mask.block_size, mask.kv_len);
    g.q_run = AsRun(q);
    g.full_kv_run = AsRun(full);
    g.partial_kv_run = AsRun(partial);
    plan.group_pairs += q.numel() * (full.numel() + partial.numel());
    g.q_index = q.to(device);
    g.full_kv_index = full.to(device);
    g.partial_kv_index = partial.to(device);
    if (partial.numel() > 0) {
      const torch::Tensor allowed = rule(q, partial);
      g.partial_mask = allowed.to(device);
      g.partial_row_any = allowed.any(1).to(device);
      g.partial_bias = AdditiveBias(allowed, device, dtype);
    }
    plan.groups.push_back(std::move(g));
  }
  // Not on CUDA: SparseAttention runs the groups there (UseDense's cost per group call was
  // measured on the CPU; a CUDA forward replays as one graph), so the bias would only take memory.
  const int64_t t = mask.q_len;
  if (!device.is_cuda() && mask.q_len == mask.kv_len &&
      t * t * static_cast<int64_t>(c10::elementSize(dtype)) <= kMaxDenseBiasBytes) {
    const torch::Tensor all = torch::arange(t, torch::kInt64);
    plan.dense_bias = AdditiveBias(rule(all, all), device, dtype);
  }
  return plan;
}

torch::Tensor SparseAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const AttentionPlan& plan, double scale) {
  if (!plan.tiles.first.empty()) return cpu::TileAttention(q, k, v, plan.tiles, scale);
  if (plan.UseDense(q.size(0)) && !q.is_cuda() &&
      plan.dense_bias.scalar_type() == q.scalar_type()) {
    // A row with no allowed key comes back 0 from the kernel, as the groups leave it.
    return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, false,
                                                                       plan.dense_bias, scale));
  }
  torch::Tensor out = torch::zeros_like(q);
  for (const AttentionPlan::Group& g : plan.groups) {
    const torch::Tensor qg = Gather(q, g.q_index, g.q_run);
    torch::Tensor o, lse;
    if (g.full_kv_index.numel() > 0) {
      std::tie(o, lse) = FusedWithLse(qg, Gather(k, g.full_kv_index, g.full_kv_run),
                                      Gather(v, g.full_kv_index, g.full_kv_run), scale);
    }
    if (g.partial_kv_index.numel() > 0) {
      auto [op, lp] = MaskedWithLse(qg, Gather(k, g.partial_kv_index, g.partial_kv_run),
                                    Gather(v, g.partial_kv_index, g.partial_kv_run), g, scale);
      if (!o.defined()) {
        o = op;
      } else {
        // Merge the two softmax pieces by their log-sum-exp.
        const torch::Tensor m = torch::maximum(lse, lp);
        const torch::Tensor wf = torch::exp(lse - m).unsqueeze(-1);
        const torch::Tensor wp = torch::exp(lp - m).unsqueeze(-1);
        o = (o.to(torch::kFloat32) * wf + op.to(torch::kFloat32) * wp) / (wf + wp);
      }
    }
    if (g.q_run.length > 0) {
      out.narrow(2, g.q_run.start, g.q_run.length).copy_(o);
    } else {
      out.index_copy_(2, g.q_index, o.to(q.scalar_type()));
    }
  }
  return out;
}

torch::Tensor GatedSparseAttention(const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, const AttentionPlan& plan, double scale,
                                   const torch::Tensor& gate, const torch::Tensor& gate_bias) {
  if (!plan.tiles.first.empty()) {
    return cpu::TileAttention(q, k, v, plan.tiles, scale, cpu::AttentionIsa::kBest, gate,
                              gate_bias);
  }
  return cpu::GateHeads(SparseAttention(q, k, v, plan, scale), gate, gate_bias);
}

torch::Tensor DenseAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& dense_mask, double scale) {
  return at::scaled_dot_product_attention(q, k, v, dense_mask, 0.0, false, scale);
}

}  // namespace praxis::model
