#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "absl/types/span.h"

namespace praxis::batching {

// The batcher's knobs. Defaults suit a CPU server on the tiny model.
struct BatchOptions {
  int64_t max_batch_rows = 8;                              // a batch closes at this many rows
  absl::Duration max_queue_delay = absl::ZeroDuration();  // ... or this long after its oldest
  int64_t max_queue_requests = 1024;                       // total queued, all keys
  int64_t max_queue_bytes = int64_t{1} << 30;              // total queued bytes, all keys
  // A batch closes before its tasks' summed Task::cost() would exceed this; a single task over it
  // still runs alone (admission bounds each task's cost).
  double max_batch_cost = std::numeric_limits<double>::infinity();
  // Batches of one layout between probes of another size (BatchSizer): each layout's batches are
  // held to the fewest rows that compute about as fast per row as its best size measured. 0: every
  // batch may fill to max_batch_rows.
  int64_t batch_probe_every = 0;
  int64_t max_sized_layouts = 64;  // layouts whose sizes are remembered (least recently used go)
};

// What the policy needs to know of one layout key's queue.
struct QueueState {
  std::string key;
  absl::Time oldest_enqueued;  // when the task at its head arrived
  int64_t rows = 0;            // rows queued under this key
  double cost = 0;             // summed Task::cost() queued under this key
  int64_t max_rows = 0;        // this key's batch size when fewer than max_batch_rows (0: that)
};

// The policy's answer: the key to run now, if any, else when to look again.
struct BatchDecision {
  std::optional<std::string> run;
  absl::Time wake_at = absl::InfiniteFuture();
};

// A queue is ready when it holds a batch's rows (max_batch_rows, or its own max_rows when fewer)
// or max_batch_cost of work, or its oldest task has waited max_queue_delay; among ready queues the
// one with the oldest task runs first, so no key starves. Pure: a function of its arguments only,
// so it is tested with literal times.
BatchDecision NextBatch(absl::Span<const QueueState> queues, absl::Time now,
                        const BatchOptions& options);

}  // namespace praxis::batching
