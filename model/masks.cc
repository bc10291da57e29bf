#include "model/masks.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace praxis::model {
namespace {

torch::Tensor Gather(const torch::Tensor& tags, const torch::Tensor& index) {
  return tags.index_select(0, index);
}

}  // namespace

absl::StatusOr<TokenTags> WindowTags(absl::Span<const Slot> slots, int64_t chunk_size) {
  if (chunk_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_size must be >= 1, got ", chunk_size));
  }
  std::vector<torch::Tensor> kinds, chunks, frames;
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    if (s.kind != kKindGlobal && s.kind != kKindNoised && s.kind != kKindClean) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", i, ": kind must be 0, 1 or 2, got ", s.kind));
    }
    if (s.frames < 1 || s.tokens_per_frame < 0) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", i, ": frames must be >= 1 and ",
                                                     "tokens_per_frame >= 0, got ", s.frames,
                                                     " and ", s.tokens_per_frame));
    }
    if (s.kind == kKindGlobal && s.frames != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", i, ": a global slot has frames == 1, got ", s.frames));
    }
    const auto opts = torch::TensorOptions().dtype(torch::kInt32);
    kinds.push_back(torch::full({s.tokens()}, s.kind, opts));
    if (s.kind == kKindGlobal) {
      chunks.push_back(torch::full({s.tokens()}, -1, opts));
      frames.push_back(torch::full({s.tokens()}, -1, opts));
    } else {
      torch::Tensor f = torch::arange(s.frames, opts).repeat_interleave(s.tokens_per_frame);
      frames.push_back(f);
      chunks.push_back(torch::div(f, chunk_size, "floor"));
    }
  }
  if (slots.empty()) {
    const auto empty = torch::empty({0}, torch::kInt32);
    return TokenTags{empty, empty, empty};
  }
  return TokenTags{torch::cat(kinds), torch::cat(chunks), torch::cat(frames)};
}

TokenTags ExpertQueryTags(int64_t n_chunks, int64_t tokens_per_chunk, int64_t chunk_size) {
  const auto opts = torch::TensorOptions().dtype(torch::kInt32);
  torch::Tensor chunk = torch::arange(n_chunks, opts).repeat_interleave(tokens_per_chunk);
  return TokenTags{torch::full_like(chunk, kKindNoised), chunk, chunk * chunk_size};
}

MaskRule ChunkCausalRule(TokenTags tags) {
  return [tags = std::move(tags)](const torch::Tensor& q, const torch::Tensor& kv) {
    const torch::Tensor qk = Gather(tags.kind, q).unsqueeze(1);
    const torch::Tensor qc = Gather(tags.chunk, q).unsqueeze(1);
    const torch::Tensor kk = Gather(tags.kind, kv).unsqueeze(0);
    const torch::Tensor kc = Gather(tags.chunk, kv).unsqueeze(0);
    const torch::Tensor q_clean = qk == kKindClean;
    const torch::Tensor q_noised = qk == kKindNoised;
    const torch::Tensor k_clean = kk == kKindClean;
    // A global query matches none of the video terms, so it attends global keys only.
    return (kk == kKindGlobal) | (q_clean & k_clean & (kc <= qc)) |
           (q_noised & (kk == kKindNoised) & (kc == qc)) | (q_noised & k_clean & (kc < qc));
  };
}

MaskRule ExpertSelfRule(TokenTags q_tags) {
  return [tags = std::move(q_tags)](const torch::Tensor& q, const torch::Tensor& kv) {
    return Gather(tags.chunk, q).unsqueeze(1) == Gather(tags.chunk, kv).unsqueeze(0);
  };
}

MaskRule ExpertCrossRule(TokenTags q_tags, TokenTags kv_tags, int64_t window) {
  return [q_tags = std::move(q_tags), kv_tags = std::move(kv_tags), window](
             const torch::Tensor& q, const torch::Tensor& kv) {
    const torch::Tensor qf = Gather(q_tags.frame, q).unsqueeze(1);
    const torch::Tensor qc = Gather(q_tags.chunk, q).unsqueeze(1);
    const torch::Tensor kk = Gather(kv_tags.kind, kv).unsqueeze(0);
    const torch::Tensor kf = Gather(kv_tags.frame, kv).unsqueeze(0);
    const torch::Tensor kc = Gather(kv_tags.chunk, kv).unsqueeze(0);
    const torch::Tensor clean_in_window = (kk == kKindClean) & (kf < qf) & (qf - kf <= window);
    return (kk == kKindGlobal) | clean_in_window | ((kk == kKindNoised) & (kc == qc));
  };
}

torch::Tensor DenseMask(const MaskRule& rule, int64_t q_len, int64_t kv_len) {
  return rule(torch::arange(q_len, torch::kInt64), torch::arange(kv_len, torch::kInt64));
}

int64_t BlockMask::nbytes() const {
  return kv_num_blocks.nbytes() + kv_indices.nbytes() + full_kv_num_blocks.nbytes() +
         full_kv_indices.nbytes();
}

torch::Tensor BlockMask::TileClasses() const {
  torch::Tensor classes = torch::zeros({num_q_tiles(), num_kv_tiles()}, torch::kInt8);
  const auto partial_n = kv_num_blocks.accessor<int32_t, 1>();
  const auto full_n = full_kv_num_blocks.accessor<int32_t, 1>();
  const auto partial = kv_indices.accessor<int32_t, 2>();
  const auto full = full_kv_indices.accessor<int32_t, 2>();
  auto out = classes.accessor<int8_t, 2>();
  for (int64_t i = 0; i < num_q_tiles(); ++i) {
    for (int32_t j = 0; j < partial_n[i]; ++j) {
      out[i][partial[i][j]] = static_cast<int8_t>(TileClass::kPartial);
    }
    for (int32_t j = 0; j < full_n[i]; ++j) {
      out[i][full[i][j]] = static_cast<int8_t>(TileClass::kFull);
    }
  }
  return classes;
}

namespace {

// Counts and index lists of the tiles flagged in `present` (bool [nq, nkv]), in flex's order:
// present tiles ascending, then the rest ascending (a stable descending sort).
std::pair<torch::Tensor, torch::Tensor> OrderedTiles(const torch::Tensor& present) {
  torch::Tensor counts = present.sum(1).to(torch::kInt32);
  torch::Tensor order = std::get<1>(present.to(torch::kInt32)
                                        .sort(/*stable=*/true, /*dim=*/1,
                                              /*descending=*/true));
  return {counts, order.to(torch::kInt32).contiguous()};
}

}  // namespace

namespace {

// Maximal runs of tokens with identical tags: run_of [tokens] int64 (the run of each token) and
// first [runs] int64 (the first token of each run). A rule is a pure function of tags, so one token
// stands for its whole run.
struct Runs {
  torch::Tensor run_of;
  torch::Tensor first;
};

Runs TagRuns(const TokenTags& t) {
  const int64_t n = t.length();
  torch::Tensor change = torch::ones({n}, torch::kBool);
  if (n > 1) {
    change.slice(0, 1) = (t.kind.slice(0, 1) != t.kind.slice(0, 0, n - 1)) |
                         (t.chunk.slice(0, 1) != t.chunk.slice(0, 0, n - 1)) |
                         (t.frame.slice(0, 1) != t.frame.slice(0, 0, n - 1));
  }
  return {change.cumsum(0) - 1, change.nonzero().flatten()};
}

// First and last run touched by each tile of `block_size` tokens.
std::pair<torch::Tensor, torch::Tensor> TileRunRanges(const Runs& runs, int64_t block_size) {
  const int64_t n = runs.run_of.numel();
  torch::Tensor starts = torch::arange(0, n, block_size, torch::kInt64);
  torch::Tensor ends = torch::clamp_max(starts + block_size, n) - 1;
  return {runs.run_of.index_select(0, starts), runs.run_of.index_select(0, ends)};
}

}  // namespace

absl::StatusOr<BlockMask> BuildBlockMask(const MaskRule& rule, const TokenTags& q_tags,
                                         const TokenTags& kv_tags, int64_t block_size) {
  const int64_t q_len = q_tags.length(), kv_len = kv_tags.length();
  if (q_len < 1 || kv_len < 1 || block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_len, kv_len and block_size must be >= 1, got ", q_len, ", ", kv_len,
                     " and ", block_size));
  }
  const Runs q_runs = TagRuns(q_tags), kv_runs = TagRuns(kv_tags);
  // The rule on one representative per run pair, and its 2-D prefix sums.
  const torch::Tensor allowed = rule(q_runs.first, kv_runs.first);
  torch::Tensor sums =
      torch::constant_pad_nd(allowed.to(torch::kInt64).cumsum(0).cumsum(1), {1, 0, 1, 0}, 0);
  const auto [qa, qb] = TileRunRanges(q_runs, block_size);
  const auto [ka, kb] = TileRunRanges(kv_runs, block_size);
  // Allowed run pairs inside each tile's rectangle of runs [qa, qb] x [ka, kb].
  const int64_t w = sums.size(1);
  auto at = [&](const torch::Tensor& r, const torch::Tensor& c) {
    return sums.flatten()
        .index_select(0, (r.unsqueeze(1) * w + c.unsqueeze(0)).flatten())
        .view({r.numel(), c.numel()});
  };
  const torch::Tensor count = at(qb + 1, kb + 1) - at(qa, kb + 1) - at(qb + 1, ka) + at(qa, ka);
  const torch::Tensor area = (qb - qa + 1).unsqueeze(1) * (kb - ka + 1).unsqueeze(0);
  // A ragged last tile holds padding, which is disallowed: never full, as in flex.
  torch::Tensor whole_q = torch::ones({qa.numel()}, torch::kBool);
  torch::Tensor whole_kv = torch::ones({ka.numel()}, torch::kBool);
  if (q_len % block_size) whole_q[-1] = false;
  if (kv_len % block_size) whole_kv[-1] = false;
  const torch::Tensor full = (count == area) & whole_q.unsqueeze(1) & whole_kv.unsqueeze(0);
  const torch::Tensor partial = (count > 0) & ~full;
  BlockMask mask;
  mask.q_len = q_len;
  mask.kv_len = kv_len;
  mask.block_size = block_size;
  std::tie(mask.kv_num_blocks, mask.kv_indices) = OrderedTiles(partial);
  std::tie(mask.full_kv_num_blocks, mask.full_kv_indices) = OrderedTiles(full);
  return mask;
}

int64_t AllowedPairs(const MaskRule& rule, const TokenTags& q_tags, const TokenTags& kv_tags) {
  const Runs q = TagRuns(q_tags), kv = TagRuns(kv_tags);
  const torch::Tensor q_sizes = torch::bincount(q.run_of).to(torch::kFloat64);
  const torch::Tensor kv_sizes = torch::bincount(kv.run_of).to(torch::kFloat64);
  const torch::Tensor allowed = rule(q.first, kv.first).to(torch::kFloat64);
  return static_cast<int64_t>(
      torch::matmul(q_sizes, torch::matmul(allowed, kv_sizes)).item<double>());
}

std::vector<AllowedBlock> AllowedBlocks(const MaskRule& rule, const TokenTags& q_tags,
                                        const TokenTags& kv_tags) {
  const Runs q = TagRuns(q_tags), kv = TagRuns(kv_tags);
  const torch::Tensor allowed = rule(q.first, kv.first).contiguous();
  const auto ok = allowed.accessor<bool, 2>();
  const auto q_first = q.first.accessor<int64_t, 1>();
  const auto kv_first = kv.first.accessor<int64_t, 1>();
  const int64_t q_runs = q.first.numel(), kv_runs = kv.first.numel();
  auto q_end = [&](int64_t i) { return i + 1 < q_runs ? q_first[i + 1] : q_tags.length(); };
  auto kv_end = [&](int64_t j) { return j + 1 < kv_runs ? kv_first[j + 1] : kv_tags.length(); };
  std::vector<AllowedBlock> blocks;
  std::vector<std::pair<int64_t, int64_t>> last;  // the previous query run's key ranges
  size_t last_first = 0;                          // its first block in `blocks`
  for (int64_t i = 0; i < q_runs; ++i) {
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int64_t j = 0; j < kv_runs; ++j) {
      if (!ok[i][j]) continue;
      if (!ranges.empty() && ranges.back().second == kv_first[j]) {
        ranges.back().second = kv_end(j);
      } else {
        ranges.emplace_back(kv_first[j], kv_end(j));
      }
    }
    if (i > 0 && ranges == last) {  // the same keys as the run before: its blocks grow
      for (size_t b = last_first; b < blocks.size(); ++b) blocks[b].q_end = q_end(i);
      continue;
    }
    last_first = blocks.size();
    for (const auto& [begin, end] : ranges) blocks.push_back({q_first[i], q_end(i), begin, end});
    last = std::move(ranges);
  }
  return blocks;
}

std::vector<Slot> EncoderSlots(const WindowLayout& l) {
  std::vector<Slot> slots = {
      {kKindGlobal, 1, l.registers},
      {kKindGlobal, 1, l.anchor_h * l.anchor_w},
      {kKindGlobal, 1, l.text_len},
      {kKindNoised, l.k * l.f, l.h * l.w},
  };
  if (l.k > 1) slots.push_back({kKindClean, (l.k - 1) * l.f, l.h * l.w});
  return slots;
}

std::vector<Slot> DecoderSlots(const WindowLayout& l, int64_t ph, int64_t pw) {
  return {{kKindGlobal, 1, l.registers}, {kKindNoised, l.k * l.f, l.h * ph * l.w * pw}};
}

int64_t MaskKey::length() const {
  int64_t n = 0;
  for (const Slot& s : slots) n += s.tokens();
  return n;
}

std::string MaskKey::DebugString() const {
  return absl::StrCat(tower == Tower::kEncoder ? "encoder" : "decoder", "[",
                      absl::StrJoin(slots, ",",
                                    [](std::string* out, const Slot& s) {
                                      absl::StrAppend(out, s.kind, ":", s.frames, "x",
                                                      s.tokens_per_frame);
                                    }),
                      "] chunk=", chunk_size, " block=", block_size);
}

MaskKey EncoderMaskKey(const WindowLayout& layout, int64_t block_size) {
  return {Tower::kEncoder, EncoderSlots(layout), layout.f, block_size};
}

MaskKey DecoderMaskKey(const WindowLayout& layout, int64_t ph, int64_t pw, int64_t block_size) {
  return {Tower::kDecoder, DecoderSlots(layout, ph, pw), layout.f, block_size};
}

absl::StatusOr<BlockMask> BuildTowerMask(const MaskKey& key) {
  PRAXIS_ASSIGN_OR_RETURN(TokenTags tags, WindowTags(key.slots, key.chunk_size));
  return BuildBlockMask(ChunkCausalRule(tags), tags, tags, key.block_size);
}

}  // namespace praxis::model
