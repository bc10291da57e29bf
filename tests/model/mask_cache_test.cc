#include "model/mask_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/status_macros.h"

namespace praxis::model {
namespace {

MaskKey KeyWithText(int64_t text_len) {
  return EncoderMaskKey(WindowLayout{.registers = 1,
                                     .anchor_h = 1,
                                     .anchor_w = 1,
                                     .text_len = text_len,
                                     .k = 2,
                                     .f = 1,
                                     .h = 1,
                                     .w = 2},
                        8);
}

// A builder that counts its calls and builds the real tower mask.
struct CountingBuilder {
  absl::StatusOr<TowerMask> operator()() {
    ++calls;
    return TowerMask{*BuildTowerMask(key), {}, {}};
  }
  MaskKey key;
  std::atomic<int> calls = 0;
};

TEST(MaskCacheTest, SecondLookupHitsAndReturnsTheSameMask) {
  MaskCache cache(4);
  CountingBuilder b{KeyWithText(3)};
  auto first = *cache.Get(b.key, std::ref(b));
  auto second = *cache.Get(b.key, std::ref(b));
  EXPECT_EQ(first.get(), second.get());
  EXPECT_EQ(b.calls, 1);
  EXPECT_EQ(cache.stats().hits, 1);
  EXPECT_EQ(cache.stats().misses, 1);
  EXPECT_TRUE(torch::equal(first->block.TileClasses(), BuildTowerMask(b.key)->TileClasses()));
}

// Each entry holds a 1000-byte dense mask on top of its BlockMask: three do not fit in 2500 bytes
// of budget, and one larger than the whole budget is still held (alone) so its batch can use it.
TEST(MaskCacheTest, ChargesEntriesByBytes) {
  auto with_dense = [](int64_t text, int64_t bytes) {
    return [=]() -> absl::StatusOr<TowerMask> {
      return TowerMask{*BuildTowerMask(KeyWithText(text)), {}, torch::zeros({bytes}, torch::kBool)};
    };
  };
  const int64_t block = (*BuildTowerMask(KeyWithText(1))).nbytes();
  MaskCache cache(64, 2 * (1000 + block) + 500);
  ASSERT_TRUE(cache.Get(KeyWithText(1), with_dense(1, 1000)).ok());
  ASSERT_TRUE(cache.Get(KeyWithText(2), with_dense(2, 1000)).ok());
  EXPECT_EQ(cache.stats().evictions, 0);
  EXPECT_GE(cache.stats().bytes, 2000);
  ASSERT_TRUE(cache.Get(KeyWithText(3), with_dense(3, 1000)).ok());
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.stats().entries, 2);
  EXPECT_LE(cache.stats().bytes, cache.max_bytes());
  auto big = cache.Get(KeyWithText(4), with_dense(4, 100000));
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(cache.stats().entries, 1) << "the others made room";
  EXPECT_GE((*big)->nbytes(), 100000);
}

TEST(MaskCacheTest, EvictsLeastRecentlyUsedBeyondCapacity) {
  MaskCache cache(2);
  ASSERT_TRUE(cache.GetTower(KeyWithText(1)).ok());
  ASSERT_TRUE(cache.GetTower(KeyWithText(2)).ok());
  ASSERT_TRUE(cache.GetTower(KeyWithText(1)).ok());  // 1 is now the most recent
  ASSERT_TRUE(cache.GetTower(KeyWithText(3)).ok());  // evicts 2
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.stats().entries, 2);
  const int64_t misses = cache.stats().misses;
  ASSERT_TRUE(cache.GetTower(KeyWithText(1)).ok());
  ASSERT_TRUE(cache.GetTower(KeyWithText(3)).ok());
  EXPECT_EQ(cache.stats().misses, misses) << "1 and 3 stayed";
  ASSERT_TRUE(cache.GetTower(KeyWithText(2)).ok());
  EXPECT_EQ(cache.stats().misses, misses + 1) << "2 was evicted";
}

TEST(MaskCacheTest, EvictedMaskStaysAliveForItsHolder) {
  MaskCache cache(1);
  std::shared_ptr<const TowerMask> held = *cache.GetTower(KeyWithText(1));
  ASSERT_TRUE(cache.GetTower(KeyWithText(2)).ok());
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_GT(held->block.num_q_tiles(), 0);
}

TEST(MaskCacheTest, ConcurrentLookupsOfOneKeyBuildOnce) {
  MaskCache cache;
  const MaskKey key = KeyWithText(5);
  std::atomic<int> builds = 0;
  absl::Notification release;
  std::atomic<int> waiting = 0;
  std::vector<std::shared_ptr<const TowerMask>> got(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      ++waiting;
      got[i] = *cache.Get(key, [&]() -> absl::StatusOr<TowerMask> {
        ++builds;
        // Hold the build until every thread has asked, so they all meet it in flight.
        release.WaitForNotificationWithTimeout(absl::Seconds(10));
        return TowerMask{*BuildTowerMask(key), {}, {}};
      });
    });
  }
  while (waiting < 16) std::this_thread::yield();
  release.Notify();
  for (auto& t : threads) t.join();
  EXPECT_EQ(builds, 1);
  for (const auto& m : got) EXPECT_EQ(m.get(), got[0].get());
  EXPECT_EQ(cache.stats().misses, 1);
  EXPECT_EQ(cache.stats().hits, 15);
}

TEST(MaskCacheTest, FailedBuildIsReportedAndNotCached) {
  MaskCache cache;
  const MaskKey key = KeyWithText(4);
  auto failed = cache.Get(key, [] { return absl::StatusOr<TowerMask>(absl::InternalError("x")); });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cache.stats().entries, 0);
  EXPECT_TRUE(cache.GetTower(key).ok()) << "a later lookup builds again";
}

TEST(MaskCacheTest, ThrowingBuildBecomesAnError) {
  MaskCache cache;
  auto failed = cache.Get(KeyWithText(4), []() -> absl::StatusOr<TowerMask> {
    const TokenTags tags = ExpertQueryTags(2, 2, 1);
    PRAXIS_ASSIGN_OR_RETURN(
        BlockMask block, BuildBlockMask([](const torch::Tensor& q, const torch::Tensor&)
                                            -> torch::Tensor { TORCH_CHECK(false, "rule failed"); },
                                        tags, tags, 2));
    return TowerMask{std::move(block), {}, {}};
  });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("rule failed"), std::string::npos);
}

}  // namespace
}  // namespace praxis::model
