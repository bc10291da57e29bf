#pragma once

// One bounded, single-flight LRU cache of built values, shared by everything the model builds
// once per layout and keeps: tower masks (model/mask_cache.h) and captured CUDA graphs
// (model/step_graphs.h).

#include <cstdint>
#include <exception>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace praxis {

// Counters of a SharedLruCache since its creation.
struct CacheStats {
  int64_t hits = 0;       // lookups answered by an entry present or being built
  int64_t misses = 0;     // lookups that built the entry
  int64_t evictions = 0;  // entries dropped to stay within capacity
  int64_t entries = 0;    // entries held now
  int64_t bytes = 0;      // bytes the built entries hold now (Value::nbytes)
};

// A small LRU cache of built values keyed by Key (hashable with Abseil), bounded by entries and by
// bytes: each value is charged its `int64_t nbytes() const`, so many hostile layouts cannot grow
// it without bound. The entry just built is never evicted to make room for itself, so one entry
// over the byte bound is held alone.
//
// Like LevelDB's Cache, it hands out shared references: an entry evicted while a caller still uses
// it stays alive until that caller drops it. Thread-safe. A missing key is built exactly once, by
// the first caller, outside the lock; callers that ask for the same key meanwhile wait for that
// build and share its result (single flight). A failed build (an error, or an exception, which
// becomes Internal naming `what`) is reported to every waiter and not cached, so a later lookup
// tries again.
template <typename Key, typename Value>
class SharedLruCache {
 public:
  using Builder = absl::FunctionRef<absl::StatusOr<Value>()>;

  // `what` names a value in errors ("a mask"); at least one entry is always allowed.
  SharedLruCache(std::string what, int64_t max_entries, int64_t max_bytes)
      : what_(std::move(what)),
        max_entries_(max_entries < 1 ? 1 : max_entries),
        max_bytes_(max_bytes) {}
  SharedLruCache(const SharedLruCache&) = delete;
  SharedLruCache& operator=(const SharedLruCache&) = delete;

  // The value of `key`, calling `build` on a miss. Returns build's error if the build failed.
  absl::StatusOr<std::shared_ptr<const Value>> Get(const Key& key, Builder build);

  CacheStats stats() const {
    absl::MutexLock lock(&mu_);
    CacheStats s = stats_;
    s.entries = static_cast<int64_t>(nodes_.size());
    s.bytes = bytes_;
    return s;
  }
  int64_t max_entries() const { return max_entries_; }
  int64_t max_bytes() const { return max_bytes_; }

 private:
  struct Node {
    absl::Notification built;
    absl::StatusOr<std::shared_ptr<const Value>> result;
    typename std::list<Key>::iterator lru_position;
    int64_t bytes = 0;  // charged once built
  };

  // Runs `build`, turning an exception into an error so that no waiter is left hanging.
  absl::StatusOr<Value> BuildGuarded(Builder build) const {
    try {
      return build();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("building ", what_, " failed: ", e.what()));
    }
  }

  // Records the finished build of `node`: charged and kept if it succeeded and is still cached,
  // dropped if it failed.
  void FinishLocked(const Key& key, Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops least recently used entries, other than `keep`, until within both bounds.
  void EvictLocked(const Node* keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string what_;
  const int64_t max_entries_;
  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<Key, std::shared_ptr<Node>> nodes_ ABSL_GUARDED_BY(mu_);
  std::list<Key> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  CacheStats stats_ ABSL_GUARDED_BY(mu_);
};

template <typename Key, typename Value>
absl::StatusOr<std::shared_ptr<const Value>> SharedLruCache<Key, Value>::Get(const Key& key,
                                                                             Builder build) {
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
    absl::StatusOr<Value> built = BuildGuarded(build);
    if (built.ok()) {
      node->result = std::make_shared<const Value>(*std::move(built));
    } else {
      node->result = built.status();
    }
    {
      absl::MutexLock lock(&mu_);
      FinishLocked(key, node.get());
    }
    node->built.Notify();
  }
  node->built.WaitForNotification();
  return node->result;
}

template <typename Key, typename Value>
void SharedLruCache<Key, Value>::FinishLocked(const Key& key, Node* node) {
  auto it = nodes_.find(key);
  if (it == nodes_.end() || it->second.get() != node) return;  // evicted while it was built
  if (node->result.ok()) {
    node->bytes = (*node->result)->nbytes();
    bytes_ += node->bytes;
    EvictLocked(node);
  } else {
    lru_.erase(node->lru_position);
    nodes_.erase(it);
  }
}

template <typename Key, typename Value>
void SharedLruCache<Key, Value>::EvictLocked(const Node* keep) {
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

}  // namespace praxis
