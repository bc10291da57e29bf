#include "model/attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
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

// A key tile of a mask row tile: its index and its allowed pairs ([rows, ld] bytes from its first
// column; null where every pair is allowed).
struct KeyTile {
  int32_t tile = 0;
  const uint8_t* allowed = nullptr;
  bool operator<(const KeyTile& o) const { return tile < o.tile; }
};

// A group of shape.key_group keys (fewer at a tile's end) that a query tile's rows attend.
struct KeyGroup {
  int64_t start = 0, length = 0;
  const uint8_t* allowed = nullptr;  // its first column's allowed pairs (row stride ld), or null:
                                     // every pair allowed
  bool all = true;                   // every pair of the query tile's rows allowed
};

// The key groups of `key_tiles` (in key order) that one of rows [r0, r0 + rows) attends.
std::vector<KeyGroup> AttendedGroups(const std::vector<KeyTile>& key_tiles, int64_t ld, int64_t r0,
                                     int64_t rows, int64_t key_group, const BlockMask& mask) {
  const int64_t bs = mask.block_size;
  std::vector<KeyGroup> groups;
  for (const KeyTile& kt : key_tiles) {
    const int64_t end = TileEnd(kt.tile, bs, mask.kv_len);
    for (int64_t g = kt.tile * bs; g < end; g += key_group) {
      KeyGroup grp{.start = g, .length = std::min(key_group, end - g)};
      bool any = kt.allowed == nullptr;
      if (kt.allowed != nullptr) {
        grp.allowed = kt.allowed + (g - kt.tile * bs);
        for (int64_t r = r0; r < r0 + rows; ++r) {
          const uint8_t* row = grp.allowed + r * ld;
          const auto allowed = [](uint8_t a) { return a != 0; };
          any = any || std::any_of(row, row + grp.length, allowed);
          grp.all = grp.all && std::all_of(row, row + grp.length, allowed);
        }
      }
      if (any) groups.push_back(grp);
    }
  }
  return groups;
}

// Appends to `tiles` the segments of one query tile (rows [r0, r0 + rows) of its mask row tile):
// runs of consecutive `groups` of at most kMaxSegmentTokens keys, each with its mask where a pair
// in it, or the row padding, is not allowed.
void AppendRuns(const std::vector<KeyGroup>& groups, int64_t ld, int64_t r0, int64_t rows,
                cpu::AttentionTiles& tiles) {
  using Tiles = cpu::AttentionTiles;
  for (size_t e = 0; e < groups.size();) {
    size_t end = e + 1;
    bool all = groups[e].all;
    while (end < groups.size() &&
           groups[end].start == groups[end - 1].start + groups[end - 1].length &&
           groups[end].start + groups[end].length - groups[e].start <= Tiles::kMaxSegmentTokens) {
      all = all && groups[end].all;
      ++end;
    }
    Tiles::Segment seg;
    seg.start = groups[e].start;
    seg.length = groups[end - 1].start + groups[end - 1].length - seg.start;
    const int64_t row = Tiles::MaskRow(seg.length);
    if (!all || row != seg.length) {
      seg.mask_at = static_cast<int64_t>(tiles.masks.size());
      tiles.masks.resize(seg.mask_at + tiles.block * row, 0);
      for (size_t x = e; x < end; ++x) {
        const KeyGroup& grp = groups[x];
        for (int64_t r = 0; r < rows; ++r) {
          uint8_t* out = tiles.masks.data() + seg.mask_at + r * row + (grp.start - seg.start);
          if (grp.allowed == nullptr) {
            std::fill_n(out, grp.length, 1);
          } else {
            std::memcpy(out, grp.allowed + (r0 + r) * ld, grp.length);
          }
        }
      }
    }
    tiles.segments.push_back(seg);
    e = end;
  }
}

// The segments TileAttention walks, in query tiles of shape.rows tokens (a divisor of the mask's
// tile): for each, the groups of shape.key_group keys of its mask tile's key tiles that one of its
// rows attends, in key order, consecutive ones merged into runs of at most kMaxSegmentTokens keys,
// each with its allowed pairs (from `rule`) where a pair in it, or the row padding, is not allowed.
cpu::AttentionTiles BuildTiles(const BlockMask& mask, const MaskRule& rule,
                               const cpu::TileShape& shape) {
  cpu::AttentionTiles tiles;
  tiles.block = shape.rows;
  tiles.q_len = mask.q_len;
  tiles.kv_len = mask.kv_len;
  const int64_t bs = mask.block_size;
  tiles.first.push_back(0);
  for (int64_t i = 0; i < mask.num_q_tiles(); ++i) {
    const std::vector<int32_t> full = RowTiles(mask.full_kv_num_blocks, mask.full_kv_indices, i);
    const std::vector<int32_t> partial = RowTiles(mask.kv_num_blocks, mask.kv_indices, i);
    const torch::Tensor q = TileTokens({static_cast<int32_t>(i)}, bs, mask.q_len);
    // The partial key tiles' allowed pairs, one rule call for all: [q rows, partial keys].
    torch::Tensor allowed;
    if (!partial.empty()) {
      allowed = rule(q, TileTokens(partial, bs, mask.kv_len)).to(torch::kUInt8).contiguous();
    }
    const int64_t ld = allowed.defined() ? allowed.size(1) : 0;
    std::vector<KeyTile> key_tiles;
    for (int32_t j : full) key_tiles.push_back({j, nullptr});
    for (int64_t p = 0, column = 0; p < static_cast<int64_t>(partial.size()); ++p) {
      key_tiles.push_back({partial[p], allowed.data_ptr<uint8_t>() + column});
      column += TileEnd(partial[p], bs, mask.kv_len) - partial[p] * bs;
    }
    std::sort(key_tiles.begin(), key_tiles.end());
    for (int64_t r0 = 0; r0 < q.numel(); r0 += shape.rows) {
      const int64_t rows = std::min(shape.rows, q.numel() - r0);
      AppendRuns(AttendedGroups(key_tiles, ld, r0, rows, shape.key_group, mask), ld, r0, rows,
                 tiles);
      tiles.first.push_back(static_cast<int64_t>(tiles.segments.size()));
    }
  }
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

AttentionPlan BuildAttentionPlan(const BlockMask& mask, const MaskRule& rule, torch::Device device,
                                 torch::ScalarType dtype, int64_t head_dim) {
  AttentionPlan plan;
  plan.length = mask.q_len;
  if (!device.is_cuda() && head_dim <= TileAttentionMaxHeadDim(dtype)) {
    plan.tiles = BuildTiles(mask, rule, cpu::TileAttentionShape(dtype, head_dim, mask.block_size));
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
