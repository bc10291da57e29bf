#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace praxis::batching {

// Learns, per layout key, how many rows its batches should hold: the fewest whose rows per second
// of compute (as the runner reports it) come within `tolerance` of the best size measured for that
// key.
// Where batching amortises (a short layout: a batch of 8 computes 2x the rows per second of one
// row) the batches stay full; where it does not (a long layout on a CPU, whose rows cost the same
// alone as together) they shrink to single rows, so that callers are answered a row at a time and
// their next requests arrive while the worker computes, instead of all waiting on one long batch.
// Sizes are powers of two up to max_rows (and max_rows); every `probe_every` batches of a key, one
// batch is sized one step below or above the current size, in turn, so that a change of the
// machine's speed or load is noticed. Remembers at most `max_keys` layouts (the least recently
// used forgotten). Thread-compatible: the Batcher calls it under its lock.
class BatchSizer {
 public:
  struct Options {
    int64_t max_rows = 8;
    int64_t probe_every = 8;  // 0: every batch may hold max_rows, nothing learned
    double tolerance = 0.10;
    int64_t max_keys = 64;
  };

  explicit BatchSizer(Options options);

  // The most rows the next batch of `key` may hold (1..max_rows) when `queued_rows` wait for it;
  // sometimes a probe's size. Call once per batch taken: it counts batches between probes.
  int64_t TakeRows(const std::string& key, int64_t queued_rows);
  // The size `key`'s batches are held to now (max_rows for a key never seen): what a queue must
  // hold to be full.
  int64_t Rows(const std::string& key) const;
  // A batch of `rows` rows of `key` computed for `took` (ignored when not positive).
  void Observe(const std::string& key, int64_t rows, absl::Duration took);
  // Each remembered key with the size its batches are held to now, in key order; none while
  // nothing is learned (with probe_every 0 no key is ever remembered). What operators see per
  // layout (praxis_batch_rows_held).
  std::vector<std::pair<std::string, int64_t>> Held() const;

 private:
  struct Measured {
    double rows_per_second = 0;  // moving average
    int64_t samples = 0;
  };
  struct Key {
    std::vector<Measured> sizes;  // per entry of sizes_
    size_t current = 0;           // index into sizes_
    int64_t since_probe = 0;
    bool probe_up = false;
    int64_t last_used = 0;
  };

  Key& Find(const std::string& key);
  size_t SizeIndex(int64_t rows) const;  // the largest size <= rows
  void Choose(Key& k) const;

  const Options options_;
  std::vector<int64_t> sizes_;  // 1, 2, 4, ..., max_rows
  std::map<std::string, Key> keys_;
  int64_t uses_ = 0;
};

}  // namespace praxis::batching
