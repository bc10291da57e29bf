#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/shared_lru_cache.h"
#include "model/attention.h"
#include "model/masks.h"

namespace praxis::model {

// Counters of a MaskCache since its creation.
using MaskCacheStats = CacheStats;

// What a tower layout's attention reads, built once per layout: the BlockMask, and (filled by the
// model on its device) either the sparse plan or the dense mask of the attention mode in use.
struct TowerMask {
  BlockMask block;
  AttentionPlan plan;
  torch::Tensor dense;  // bool [T, T], only in AttentionMode::kDense

  int64_t nbytes() const;
};

// The cache of built tower masks keyed by MaskKey (the layout key), shared by every batch of a
// model: a SharedLruCache (bounded by entries and by bytes, single flight, thread-safe), where a
// dense [T, T] mask or a long layout's plan is charged what it holds (TowerMask::nbytes). An
// entry evicted while a batch still uses it stays alive until that batch drops it.
class MaskCache : public SharedLruCache<MaskKey, TowerMask> {
 public:
  explicit MaskCache(int64_t max_entries = 64, int64_t max_bytes = int64_t{256} << 20)
      : SharedLruCache("a mask", max_entries, max_bytes) {}

  // The mask of `key` built with BuildTowerMask (BlockMask only) on a miss.
  absl::StatusOr<std::shared_ptr<const TowerMask>> GetTower(const MaskKey& key);
};

}  // namespace praxis::model
