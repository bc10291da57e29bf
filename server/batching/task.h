#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace praxis::batching {

// One request as the batcher sees it: a layout key (tasks with equal keys may share a batch), a
// size in rows and bytes, a deadline and a cancellation flag. The batcher never looks inside.
//
// Ownership passes to the batcher on a successful Submit, and from it to exactly one of: the batch
// runner (which then answers the task), or Fail (deadline passed, cancelled, shut down). So each
// accepted task gets exactly one final answer. Implementations must make cancelled() thread-safe.
class Task {
 public:
  virtual ~Task() = default;
  virtual const std::string& layout_key() const = 0;
  // Rows this task adds to a batch (its client batch size B >= 1); a task is never split.
  virtual int64_t rows() const = 0;
  virtual int64_t bytes() const = 0;
  // The work this task adds to a batch, in the unit of BatchOptions::max_batch_cost (praxis-server:
  // useful GFLOP); 0 for tasks that do not say.
  virtual double cost() const { return 0; }
  // absl::InfiniteFuture() when the caller set none.
  virtual absl::Time deadline() const = 0;
  virtual bool cancelled() const = 0;
  // The final answer of a task that will not run.
  virtual void Fail(absl::Status status) = 0;
};

}  // namespace praxis::batching
