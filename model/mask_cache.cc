#include "model/mask_cache.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace praxis::model {
namespace {

// Runs `build`, turning a LibTorch exception into an error so that no waiter is left hanging.
absl::StatusOr<TowerMask> BuildGuarded(MaskCache::Builder build) {
  try {
    return build();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("building a mask failed: ", e.what()));
  }
}

}  // namespace

MaskCache::MaskCache(int64_t max_entries, int64_t max_bytes)
    : max_entries_(std::max<int64_t>(1, max_entries)), max_bytes_(max_bytes) {}

absl::StatusOr<std::shared_ptr<const TowerMask>> MaskCache::Get(const MaskKey& key, Builder build) {
  std::shared_ptr<Node> node;
  bool must_build = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = nodes_.find(key);
    if (it != nodes_.end()) {
      ++stats_.hits;
      node = it->second;
      lru_.splice(lru_.begin(), lru_, node->lru_position);
    } else {
      ++stats_.misses;
      must_build = true;
      node = std::make_shared<Node>();
      lru_.push_front(key);
      node->lru_position = lru_.begin();
      nodes_.emplace(key, node);
      EvictLocked(node.get());
    }
  }
  if (must_build) {
    absl::StatusOr<TowerMask> built = BuildGuarded(build);
    if (built.ok()) {
      auto mask = std::make_shared<const TowerMask>(*std::move(built));
      node->result = mask;
      absl::MutexLock lock(&mu_);
      auto it = nodes_.find(key);
      if (it != nodes_.end() && it->second == node) {  // not evicted while it was built
        node->bytes = mask->nbytes();
        bytes_ += node->bytes;
        EvictLocked(node.get());
      }
    } else {
      node->result = built.status();
      absl::MutexLock lock(&mu_);
      auto it = nodes_.find(key);
      if (it != nodes_.end() && it->second == node) {
        lru_.erase(node->lru_position);
        nodes_.erase(it);
      }
    }
    node->built.Notify();
  }
  node->built.WaitForNotification();
  return node->result;
}

absl::StatusOr<std::shared_ptr<const TowerMask>> MaskCache::GetTower(const MaskKey& key) {
  return Get(key, [&key]() -> absl::StatusOr<TowerMask> {
    PRAXIS_ASSIGN_OR_RETURN(BlockMask block, BuildTowerMask(key));
    return TowerMask{std::move(block), {}, {}};
  });
}

int64_t TowerMask::nbytes() const {
  return block.nbytes() + plan.nbytes() + (dense.defined() ? dense.nbytes() : 0);
}

MaskCacheStats MaskCache::stats() const {
  absl::MutexLock lock(&mu_);
  MaskCacheStats s = stats_;
  s.entries = static_cast<int64_t>(nodes_.size());
  s.bytes = bytes_;
  return s;
}

void MaskCache::EvictLocked(const Node* keep) {
  auto victim = lru_.end();
  while ((static_cast<int64_t>(nodes_.size()) > max_entries_ || bytes_ > max_bytes_) &&
         victim != lru_.begin()) {
    --victim;
    auto it = nodes_.find(*victim);
    if (it->second.get() == keep) continue;
    bytes_ -= it->second->bytes;
    nodes_.erase(it);
    victim = lru_.erase(victim);
    ++stats_.evictions;
  }
}

}  // namespace praxis::model
