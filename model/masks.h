#pragma once

// Attention masks of the chunk-causal window (seed masks-api-0.4.0, SPEC §3).
//
// Every token carries three int32 tags: its kind (global, noised, clean), its chunk and its latent
// frame. A mask rule is a pure function of the tags of a query and a key, evaluated vectorised on
// tensors, so one rule serves the dense boolean mask and the tile-sparse BlockMask alike.

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "wire/step_inputs.h"

namespace praxis::model {

inline constexpr int32_t kKindGlobal = 0;
inline constexpr int32_t kKindNoised = 1;
inline constexpr int32_t kKindClean = 2;

// Default tile edge of BlockMask, as in flex attention.
inline constexpr int64_t kDefaultBlockSize = 128;

// A run of tokens of one kind: `frames` latent frames of `tokens_per_frame` tokens each. A global
// slot has frames == 1.
struct Slot {
  int32_t kind = kKindGlobal;
  int64_t frames = 1;
  int64_t tokens_per_frame = 0;

  int64_t tokens() const { return frames * tokens_per_frame; }
  friend bool operator==(const Slot&, const Slot&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Slot& s) {
    return H::combine(std::move(h), s.kind, s.frames, s.tokens_per_frame);
  }
};

// Per-token tags of one sequence: int32 CPU tensors of shape [tokens].
struct TokenTags {
  torch::Tensor kind;
  torch::Tensor chunk;
  torch::Tensor frame;

  int64_t length() const { return kind.numel(); }
};

// Tags of a sequence laid out as `slots` in order. Frame f of a video slot (counted from the slot's
// start) belongs to chunk f / chunk_size; global tokens get chunk = frame = -1. InvalidArgument for
// a non-positive chunk_size, an unknown kind, a global slot with frames != 1 or negative sizes.
absl::StatusOr<TokenTags> WindowTags(absl::Span<const Slot> slots, int64_t chunk_size);

// Tags of the action expert's queries: `tokens_per_chunk` tokens for each of `n_chunks` chunks, of
// kind noised, chunk c and frame c * chunk_size (the first frame of their chunk).
TokenTags ExpertQueryTags(int64_t n_chunks, int64_t tokens_per_chunk, int64_t chunk_size);

// A mask rule evaluated on the outer grid of query indices q [n] and key indices kv [m] (int64):
// returns bool [n, m], true where query q[i] may attend key kv[j].
using MaskRule = std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& kv)>;

// The trunk towers' rule: every token attends every global token; a global token attends only
// global tokens; a clean token attends the clean tokens of its own and earlier chunks; a noised
// token attends the noised tokens of its own chunk and the clean tokens of earlier chunks.
MaskRule ChunkCausalRule(TokenTags tags);

// The action expert's self attention: one block per chunk (same chunk tag).
MaskRule ExpertSelfRule(TokenTags q_tags);

// The action expert's cross attention: a query of chunk c (first frame qf in its frame tag) attends
// every global key, clean keys of frame kf with kf < qf and qf - kf <= window, and the noised keys
// of its own chunk.
MaskRule ExpertCrossRule(TokenTags q_tags, TokenTags kv_tags, int64_t window);

// The rule on the whole grid: bool [q_len, kv_len].
torch::Tensor DenseMask(const MaskRule& rule, int64_t q_len, int64_t kv_len);

// How one tile of the [q_len, kv_len] grid is attended.
enum class TileClass : int8_t { kEmpty = 0, kPartial = 1, kFull = 2 };

// The tile-sparse form of a mask, with the fields and layout of PyTorch flex attention's BlockMask
// (batch and head axes dropped: one mask serves them all). Per query tile i, `full_kv_indices[i]`
// lists the tiles where every pair is allowed and `kv_indices[i]` the tiles where some are; each
// row lists its present tiles first, ascending, then the absent ones ascending (flex's filler).
// Empty tiles appear in neither list; a ragged last tile is never full. Immutable once built.
struct BlockMask {
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t block_size = kDefaultBlockSize;
  torch::Tensor kv_num_blocks;       // int32 [num_q_tiles]: partial tiles per query tile
  torch::Tensor kv_indices;          // int32 [num_q_tiles, num_kv_tiles]
  torch::Tensor full_kv_num_blocks;  // int32 [num_q_tiles]: full tiles per query tile
  torch::Tensor full_kv_indices;     // int32 [num_q_tiles, num_kv_tiles]

  int64_t num_q_tiles() const { return kv_num_blocks.numel(); }
  int64_t num_kv_tiles() const { return kv_indices.size(1); }
  // Bytes held by the four index tensors.
  int64_t nbytes() const;
  // The class of every tile, int8 [num_q_tiles, num_kv_tiles] of TileClass values.
  torch::Tensor TileClasses() const;
};

// Builds the BlockMask of `rule` over queries tagged `q_tags` and keys tagged `kv_tags`. A rule is
// a pure function of tags (the seed's contract), so the rule is evaluated once per pair of tag runs
// (maximal stretches of identical tags), and each tile is classified from the runs it covers by
// 2-D prefix sums: no dense mask is ever formed, and the cost grows with the tile and run counts,
// not with q_len * kv_len. InvalidArgument for empty sequences or a non-positive block size.
absl::StatusOr<BlockMask> BuildBlockMask(const MaskRule& rule, const TokenTags& q_tags,
                                         const TokenTags& kv_tags,
                                         int64_t block_size = kDefaultBlockSize);

// The number of allowed (query, key) pairs of `rule`, counted per tag run: the useful work of an
// attention call, for FLOP accounting.
int64_t AllowedPairs(const MaskRule& rule, const TokenTags& q_tags, const TokenTags& kv_tags);

// A rectangle of allowed pairs: queries [q_begin, q_end) each attend keys [kv_begin, kv_end).
struct AllowedBlock {
  int64_t q_begin = 0, q_end = 0, kv_begin = 0, kv_end = 0;
};

// The allowed pairs of `rule` as disjoint rectangles covering them exactly: each query tag run's
// allowed key runs merged into contiguous ranges, and adjacent query runs with the same ranges
// merged. The products an attention must do as GEMMs (a chunk-causal window's query chunk attends
// at most three key ranges), which step_bench's --gemm_bound times beside the step.
std::vector<AllowedBlock> AllowedBlocks(const MaskRule& rule, const TokenTags& q_tags,
                                        const TokenTags& kv_tags);

// The geometry of one window step, as far as the masks care: register count, anchor grid, text
// length, K chunks of F latent frames, and the latent grid h x w the encoder sees.
struct WindowLayout {
  int64_t registers = 0;
  int64_t anchor_h = 0;
  int64_t anchor_w = 0;
  int64_t text_len = 0;
  int64_t k = 1;
  int64_t f = 1;
  int64_t h = 0;
  int64_t w = 0;
};

// The benchmark layout of the issues (registers 4, anchor 30x40, text 256, K = 4, F = 2,
// h x w = 30 x 40): an 18 260-token encoder sequence, shared by benchmarks and tests.
inline constexpr WindowLayout kBenchLayout{.registers = 4,
                                           .anchor_h = 30,
                                           .anchor_w = 40,
                                           .text_len = 256,
                                           .k = 4,
                                           .f = 2,
                                           .h = 30,
                                           .w = 40};

// A step's geometry as a window layout with `registers` registers, and back (registers dropped).
inline WindowLayout WindowOf(const wire::StepGeometry& g, int64_t registers = 0) {
  return {.registers = registers,
          .anchor_h = g.anchor_h,
          .anchor_w = g.anchor_w,
          .text_len = g.text_len,
          .k = g.k,
          .f = g.f,
          .h = g.h,
          .w = g.w};
}
inline wire::StepGeometry GeometryOf(const WindowLayout& l) {
  return {.text_len = l.text_len,
          .anchor_h = l.anchor_h,
          .anchor_w = l.anchor_w,
          .k = l.k,
          .f = l.f,
          .h = l.h,
          .w = l.w};
}

// The window layout of a step (registers left 0: they are the config's). `in` must have passed
// ValidateStep.
inline WindowLayout StepLayout(const wire::StepInputs& in) {
  return WindowOf(wire::GeometryOf(in));
}

// Encoder sequence [registers | anchor | text | noised | clean] (clean absent when K == 1).
std::vector<Slot> EncoderSlots(const WindowLayout& layout);

// Decoder sequence [registers | noised] on the fine grid (h * ph, w * pw).
std::vector<Slot> DecoderSlots(const WindowLayout& layout, int64_t ph, int64_t pw);

enum class Tower : int8_t { kEncoder = 0, kDecoder = 1 };

// Everything a tower's mask depends on; equal keys share one cached mask.
struct MaskKey {
  Tower tower = Tower::kEncoder;
  std::vector<Slot> slots;
  int64_t chunk_size = 1;
  int64_t block_size = kDefaultBlockSize;

  int64_t length() const;
  std::string DebugString() const;
  friend bool operator==(const MaskKey&, const MaskKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const MaskKey& k) {
    return H::combine(std::move(h), k.tower, k.slots, k.chunk_size, k.block_size);
  }
};

MaskKey EncoderMaskKey(const WindowLayout& layout, int64_t block_size);
MaskKey DecoderMaskKey(const WindowLayout& layout, int64_t ph, int64_t pw, int64_t block_size);

// The chunk-causal BlockMask of a tower layout (what the MaskCache builds on a miss).
absl::StatusOr<BlockMask> BuildTowerMask(const MaskKey& key);

}  // namespace praxis::model
