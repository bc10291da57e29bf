#pragma once

#include <cstdint>
#include <list>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "model/attention.h"
#include "model/masks.h"

namespace praxis::model {

// Counters of a MaskCache since its creation.
struct MaskCacheStats {
  int64_t hits = 0;       // lookups answered by an entry present or being built
  int64_t misses = 0;     // lookups that built the entry
  int64_t evictions = 0;  // entries dropped to stay within capacity
  int64_t entries = 0;    // entries held now
  int64_t bytes = 0;      // bytes the built entries hold now (TowerMask::nbytes)
};

// What a tower layout's attention reads, built once per layout: the BlockMask, and (filled by the
// model on its device) either the sparse plan or the dense mask of the attention mode in use.
struct TowerMask {
  BlockMask block;
  AttentionPlan plan;
  torch::Tensor dense;  // bool [T, T], only in AttentionMode::kDense

  int64_t nbytes() const;
};

// A small LRU cache of built tower masks keyed by MaskKey (the layout key), shared by every batch
// of a model, bounded by entries and by bytes: a dense [T, T] mask or a long layout's plan is
// charged what it holds, so many hostile layouts cannot grow it without bound. The entry just
// built is never evicted to make room for itself, so one entry over the byte bound is held alone.
//
// Like LevelDB's Cache, it hands out shared references: an entry evicted while a batch still uses
// it stays alive until that batch drops it. Thread-safe. A missing key is built exactly once, by
// the first caller, outside the lock; callers that ask for the same key meanwhile wait for that
// build and share its result (single flight). A failed build is reported to every waiter and not
// cached, so a later lookup tries again.
class MaskCache {
 public:
  using Builder = absl::FunctionRef<absl::StatusOr<TowerMask>()>;

  explicit MaskCache(int64_t max_entries = 64, int64_t max_bytes = int64_t{256} << 20);
  MaskCache(const MaskCache&) = delete;
  MaskCache& operator=(const MaskCache&) = delete;

  // The mask of `key`, calling `build` on a miss. Returns build's error if the build failed.
  absl::StatusOr<std::shared_ptr<const TowerMask>> Get(const MaskKey& key, Builder build);

  // The mask of `key` built with BuildTowerMask (BlockMask only) on a miss.
  absl::StatusOr<std::shared_ptr<const TowerMask>> GetTower(const MaskKey& key);

  MaskCacheStats stats() const;
  int64_t max_entries() const { return max_entries_; }
  int64_t max_bytes() const { return max_bytes_; }

 private:
  struct Node {
    absl::Notification built;
    absl::StatusOr<std::shared_ptr<const TowerMask>> result;
    std::list<MaskKey>::iterator lru_position;
    int64_t bytes = 0;  // charged once built
  };

  // Drops least recently used entries, other than `keep`, until within both bounds.
  void EvictLocked(const Node* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_entries_;
  const int64_t max_bytes_;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<MaskKey, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  std::list<MaskKey> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  MaskCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace praxis::model
