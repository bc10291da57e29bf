#include "model/masks.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace praxis::model {
namespace {

// Hand-built window: 2 registers, a 1x2 anchor, 2 text tokens (6 globals), then K = 3 chunks of
// F = 1 frame of 2 tokens, noised (tokens 6..11) and clean copies of chunks 0..1 (tokens 12..15).
constexpr int64_t kG = 0, kN0 = 6, kN1 = 8, kN2 = 10, kC0 = 12, kC1 = 14;

struct HandWindow {
  HandWindow() {
    const WindowLayout layout{.registers = 2,
                              .anchor_h = 1,
                              .anchor_w = 2,
                              .text_len = 2,
                              .k = 3,
                              .f = 1,
                              .h = 1,
                              .w = 2};
    TokenTags tags = *WindowTags(EncoderSlots(layout), 1);
    dense = DenseMask(ChunkCausalRule(tags), tags.length(), tags.length());
  }
  bool allowed(int64_t q, int64_t kv) const { return dense[q][kv].item<bool>(); }
  torch::Tensor dense;
};

TEST(WindowTagsTest, ChunkOfFrameIsFrameDivChunkSizeAndGlobalsAreMinusOne) {
  TokenTags t = *WindowTags({{kKindGlobal, 1, 3}, {kKindNoised, 5, 2}, {kKindClean, 4, 1}}, 2);
  ASSERT_EQ(t.length(), 3 + 10 + 4);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(t.kind[i].item<int>(), kKindGlobal);
    EXPECT_EQ(t.chunk[i].item<int>(), -1);
    EXPECT_EQ(t.frame[i].item<int>(), -1);
  }
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(t.kind[3 + i].item<int>(), kKindNoised);
    EXPECT_EQ(t.frame[3 + i].item<int>(), i / 2) << "noised token " << i;
    EXPECT_EQ(t.chunk[3 + i].item<int>(), (i / 2) / 2) << "noised token " << i;
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.kind[13 + i].item<int>(), kKindClean);
    EXPECT_EQ(t.frame[13 + i].item<int>(), i) << "frames count from the slot's start";
    EXPECT_EQ(t.chunk[13 + i].item<int>(), i / 2);
  }
  EXPECT_EQ(t.kind.scalar_type(), torch::kInt32);
}

TEST(WindowTagsTest, RejectsBadSlots) {
  EXPECT_FALSE(WindowTags({{kKindGlobal, 2, 3}}, 1).ok());
  EXPECT_FALSE(WindowTags({{7, 1, 3}}, 1).ok());
  EXPECT_FALSE(WindowTags({{kKindNoised, 0, 3}}, 1).ok());
  EXPECT_FALSE(WindowTags({{kKindNoised, 1, 3}}, 0).ok());
}

TEST(ChunkCausalRuleTest, EveryTokenAttendsEveryGlobalToken) {
  HandWindow w;
  for (int64_t q = 0; q < 16; ++q)
    for (int64_t kv = kG; kv < kN0; ++kv) EXPECT_TRUE(w.allowed(q, kv)) << q << "," << kv;
}

TEST(ChunkCausalRuleTest, GlobalTokenAttendsOnlyGlobalTokens) {
  HandWindow w;
  for (int64_t q = kG; q < kN0; ++q)
    for (int64_t kv = kN0; kv < 16; ++kv) EXPECT_FALSE(w.allowed(q, kv)) << q << "," << kv;
}

TEST(ChunkCausalRuleTest, CleanAttendsCleanOfOwnAndEarlierChunks) {
  HandWindow w;
  EXPECT_TRUE(w.allowed(kC0, kC0 + 1));  // own chunk
  EXPECT_FALSE(w.allowed(kC0, kC1));     // later chunk
  EXPECT_TRUE(w.allowed(kC1, kC0));      // earlier chunk
  EXPECT_TRUE(w.allowed(kC1 + 1, kC1));  // own chunk
}

TEST(ChunkCausalRuleTest, NoisedAttendsNoisedOfOwnChunkOnly) {
  HandWindow w;
  EXPECT_TRUE(w.allowed(kN1, kN1 + 1));
  EXPECT_FALSE(w.allowed(kN1, kN0));
  EXPECT_FALSE(w.allowed(kN1, kN2));
  EXPECT_TRUE(w.allowed(kN2 + 1, kN2));
}

TEST(ChunkCausalRuleTest, NoisedAttendsCleanOfEarlierChunksOnly) {
  HandWindow w;
  EXPECT_FALSE(w.allowed(kN0, kC0));  // clean twin of its own chunk
  EXPECT_TRUE(w.allowed(kN1, kC0));
  EXPECT_FALSE(w.allowed(kN1, kC1));
  EXPECT_TRUE(w.allowed(kN2, kC0));
  EXPECT_TRUE(w.allowed(kN2, kC1 + 1));
}

TEST(ChunkCausalRuleTest, CleanNeverAttendsNoised) {
  HandWindow w;
  for (int64_t q = kC0; q < 16; ++q)
    for (int64_t kv = kN0; kv < kC0; ++kv) EXPECT_FALSE(w.allowed(q, kv)) << q << "," << kv;
}

TEST(ExpertSelfRuleTest, OneBlockPerChunk) {
  TokenTags q = ExpertQueryTags(3, 2, 4);
  torch::Tensor d = DenseMask(ExpertSelfRule(q), 6, 6);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(d[i][j].item<bool>(), i / 2 == j / 2);
}

// Keys: 1 global, 6 noised frames, 6 clean frames, one token each, chunk size 2; queries of
// chunks 0..2 (first frames 0, 2, 4).
class ExpertCrossRuleTest : public ::testing::Test {
 protected:
  torch::Tensor Dense(int64_t window) {
    TokenTags kv = *WindowTags({{kKindGlobal, 1, 1}, {kKindNoised, 6, 1}, {kKindClean, 6, 1}}, 2);
    return DenseMask(ExpertCrossRule(ExpertQueryTags(3, 1, 2), kv, window), 3, 13);
  }
  static constexpr int64_t kNoised = 1, kClean = 7;
};

TEST_F(ExpertCrossRuleTest, AttendsEveryGlobalKey) {
  torch::Tensor d = Dense(0);
  for (int64_t c = 0; c < 3; ++c) EXPECT_TRUE(d[c][0].item<bool>());
}

TEST_F(ExpertCrossRuleTest, AttendsCleanFramesStrictlyBeforeItsChunkWithinWindow) {
  torch::Tensor d = Dense(3);  // chunk 2 starts at frame 4: clean frames 1, 2, 3 are in reach
  for (int64_t f = 0; f < 6; ++f) {
    EXPECT_EQ(d[2][kClean + f].item<bool>(), f >= 1 && f < 4) << "frame " << f;
    EXPECT_FALSE(d[0][kClean + f].item<bool>()) << "chunk 0 has no earlier frames";
  }
  EXPECT_FALSE(Dense(0)[2][kClean + 3].item<bool>()) << "window 0 reaches no clean frame";
}

TEST_F(ExpertCrossRuleTest, AttendsNoisedFramesOfItsOwnChunk) {
  torch::Tensor d = Dense(6);
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t f = 0; f < 6; ++f) EXPECT_EQ(d[c][kNoised + f].item<bool>(), f / 2 == c);
}

// The tile classes of a dense mask by brute force, for comparison with BuildBlockMask.
torch::Tensor BruteForceTiles(const torch::Tensor& dense, int64_t bs) {
  const int64_t nq = (dense.size(0) + bs - 1) / bs, nkv = (dense.size(1) + bs - 1) / bs;
  torch::Tensor out = torch::zeros({nq, nkv}, torch::kInt8);
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t j = 0; j < nkv; ++j) {
      torch::Tensor tile = dense.slice(0, i * bs, (i + 1) * bs).slice(1, j * bs, (j + 1) * bs);
      const int64_t allowed = tile.sum().item<int64_t>();
      const bool whole = tile.size(0) == bs && tile.size(1) == bs;
      const TileClass c = allowed == 0                  ? TileClass::kEmpty
                          : whole && allowed == bs * bs ? TileClass::kFull
                                                        : TileClass::kPartial;
      out[i][j] = static_cast<int8_t>(c);
    }
  }
  return out;
}

TEST(BlockMaskTest, ClassesMatchBruteForceOnRandomLayouts) {
  std::mt19937 rng(20261202);
  auto pick = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const int64_t block_sizes[] = {8, 16, 32, 64, 128};
  for (int trial = 0; trial < 220; ++trial) {
    const WindowLayout l{.registers = pick(0, 5),
                         .anchor_h = pick(1, 4),
                         .anchor_w = pick(1, 5),
                         .text_len = pick(1, 30),
                         .k = pick(1, 4),
                         .f = pick(1, 3),
                         .h = pick(1, 6),
                         .w = pick(1, 7)};
    const int64_t bs = block_sizes[pick(0, 4)];
    const bool decoder = trial % 3 == 2;
    const MaskKey key =
        decoder ? DecoderMaskKey(l, pick(1, 2), pick(1, 2), bs) : EncoderMaskKey(l, bs);
    TokenTags tags = *WindowTags(key.slots, key.chunk_size);
    const int64_t n = tags.length();
    const BlockMask m = *BuildTowerMask(key);
    const torch::Tensor dense = DenseMask(ChunkCausalRule(tags), n, n);
    ASSERT_EQ(AllowedPairs(ChunkCausalRule(tags), tags, tags), dense.sum().item<int64_t>());
    // The rectangles cover every allowed pair once and nothing else.
    // Under the chunk-causal rule a query's keys are at most three ranges.
    torch::Tensor covered = torch::zeros({n, n}, torch::kInt64);
    std::map<int64_t, int> ranges;
    for (const AllowedBlock& b : AllowedBlocks(ChunkCausalRule(tags), tags, tags)) {
      ASSERT_TRUE(b.q_begin < b.q_end && b.kv_begin < b.kv_end) << key.DebugString();
      covered.slice(0, b.q_begin, b.q_end).slice(1, b.kv_begin, b.kv_end) += 1;
      ASSERT_LE(++ranges[b.q_begin], 3) << key.DebugString();
    }
    ASSERT_TRUE(torch::equal(covered, dense.to(torch::kInt64))) << key.DebugString();
    ASSERT_TRUE(torch::equal(m.TileClasses(), BruteForceTiles(dense, bs))) << key.DebugString();
    // Flex's row layout: present tiles first, ascending.
    for (int64_t i = 0; i < m.num_q_tiles(); ++i) {
      const int64_t np = m.kv_num_blocks[i].item<int64_t>();
      torch::Tensor present = m.kv_indices[i].slice(0, 0, np);
      ASSERT_TRUE(torch::equal(present, std::get<0>(present.sort()))) << key.DebugString();
    }
  }
}

TEST(BlockMaskTest, RaggedLastTileIsPartialEvenWhenAllAllowed) {
  MaskRule all = [](const torch::Tensor& q, const torch::Tensor& kv) {
    return torch::ones({q.numel(), kv.numel()}, torch::kBool);
  };
  const TokenTags tags = *WindowTags({{kKindNoised, 10, 1}}, 1);
  BlockMask m = *BuildBlockMask(all, tags, tags, 8);
  EXPECT_EQ(m.full_kv_num_blocks[0].item<int>(), 1);
  EXPECT_EQ(m.kv_num_blocks[0].item<int>(), 1);
  EXPECT_EQ(m.kv_indices[0][0].item<int>(), 1);
  EXPECT_EQ(m.full_kv_num_blocks[1].item<int>(), 0);
  EXPECT_EQ(m.kv_num_blocks[1].item<int>(), 2);
}

TEST(BlockMaskTest, LongSequenceBuildsWithoutTheDenseGrid) {
  // 18260 tokens: the dense grid would be 333 MB of bools.
  BlockMask m = *BuildTowerMask(EncoderMaskKey(kBenchLayout, 128));
  EXPECT_EQ(m.q_len, 4 + 1200 + 256 + 8 * 1200 + 6 * 1200);
  torch::Tensor classes = m.TileClasses();
  const double empty = (classes == 0).sum().item<double>() / classes.numel();
  EXPECT_GT(empty, 0.3);
  EXPECT_LT(empty, 0.9);
}

TEST(BlockMaskTest, RejectsEmptyGrid) {
  const TokenTags none = ExpertQueryTags(0, 1, 1), one = ExpertQueryTags(1, 1, 1);
  EXPECT_FALSE(BuildBlockMask(ExpertSelfRule(one), none, one, 8).ok());
  EXPECT_FALSE(BuildBlockMask(ExpertSelfRule(one), one, one, 0).ok());
}

TEST(MaskKeyTest, EqualLayoutsShareAKeyAndDifferentOnesDoNot) {
  const WindowLayout a{
      .registers = 4, .anchor_h = 2, .anchor_w = 3, .text_len = 5, .k = 2, .f = 2, .h = 2, .w = 3};
  WindowLayout b = a;
  EXPECT_EQ(EncoderMaskKey(a, 64), EncoderMaskKey(b, 64));
  b.text_len = 6;
  EXPECT_FALSE(EncoderMaskKey(a, 64) == EncoderMaskKey(b, 64));
  EXPECT_FALSE(EncoderMaskKey(a, 64) == EncoderMaskKey(a, 128));
  EXPECT_EQ(EncoderSlots(WindowLayout{.k = 1}).size(), 4u) << "K == 1 has no clean slot";
  EXPECT_EQ(DecoderSlots(a, 2, 2)[1].tokens_per_frame, 4 * 6);
}

}  // namespace
}  // namespace praxis::model
