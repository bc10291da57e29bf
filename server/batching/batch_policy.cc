#include "server/batching/batch_policy.h"

#include <algorithm>

namespace praxis::batching {

BatchDecision NextBatch(absl::Span<const QueueState> queues, absl::Time now,
                        const BatchOptions& options) {
  BatchDecision d;
  const QueueState* best = nullptr;
  for (const QueueState& q : queues) {
    if (q.rows <= 0) continue;
    const absl::Time due = q.oldest_enqueued + options.max_queue_delay;
    const int64_t full =
        q.max_rows > 0 ? std::min(q.max_rows, options.max_batch_rows) : options.max_batch_rows;
    const bool ready = q.rows >= full || q.cost >= options.max_batch_cost || due <= now;
    if (ready) {
      if (best == nullptr || q.oldest_enqueued < best->oldest_enqueued) best = &q;
    } else {
      d.wake_at = std::min(d.wake_at, due);
    }
  }
  if (best != nullptr) d.run = best->key;
  return d;
}

}  // namespace praxis::batching
