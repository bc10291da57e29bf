#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/batching/batch_policy.h"
#include "server/batching/batch_sizer.h"
#include "server/batching/clock.h"
#include "server/batching/task.h"

namespace praxis::batching {

// Counters and levels of a Batcher.
struct BatcherStats {
  int64_t queued_requests = 0;
  int64_t queued_bytes = 0;
  int64_t batches = 0;
  int64_t expired = 0;    // failed DEADLINE_EXCEEDED while queued, never run
  int64_t cancelled = 0;  // dropped while queued
};

// The dynamic batcher: one FIFO per layout key, batches chosen by NextBatch, run by worker
// threads outside the lock.
//
// Its workers share one machine: a batch taken while no other runs and none other is ready runs
// alone on the whole machine (the runner is told `shares` 1) and no worker takes another until it
// ends; a batch taken while another runs, or with another ready behind it, runs beside it on a
// share (`shares` = the worker count). Only the first worker (the lead) runs batches alone, so
// that on a CPU one thread alone ever owns a team of intra-op threads: a lone caller's row gets
// every core, while many callers' batches each get a core of their own instead of one team's
// barriers.
//
// Thread-safe. Submit never blocks: beyond the request or byte budget it refuses at once with
// RESOURCE_EXHAUSTED (and UNAVAILABLE once draining). Before each batch, queued tasks whose
// deadline passed are failed with DEADLINE_EXCEEDED and cancelled ones with CANCELLED; neither is
// run. A batch holds tasks of one key, in arrival order, up to max_batch_rows rows (or fewer,
// as BatchSizer learns from the runner's compute time per batch when batch_probe_every > 0) and
// max_batch_cost of work (a task larger than either runs alone); the runner receives ownership and
// answers each task exactly once.
class Batcher {
 public:
  // Runs a batch on 1 / `shares` of the machine and answers its tasks; returns how long the batch
  // kept its share busy (its compute, which the sizer learns from), or zero for the batcher to
  // time the whole call.
  using Runner =
      std::function<absl::Duration(std::vector<std::unique_ptr<Task>> batch, int shares)>;

  // Starts `workers` threads that call `runner`, sharing the machine as above. Arrival, deadlines,
  // delays and drain grace are read on `clock` (not owned; it must outlive the Batcher).
  Batcher(BatchOptions options, Runner runner, int workers = 1, Clock* clock = RealClock());
  // Drains with no grace: queued tasks are failed UNAVAILABLE; the running batches finish.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Queues `task`. On error the task is handed back untouched (not failed) for the caller to
  // answer: RESOURCE_EXHAUSTED over budget, UNAVAILABLE when draining, InvalidArgument for a task
  // with rows < 1.
  absl::Status Submit(std::unique_ptr<Task>& task);

  // Stops accepting, runs what is queued for up to `grace`, fails the rest UNAVAILABLE, and waits
  // for the workers until the same deadline. True when every worker has exited; false when a batch
  // still runs (the destructor then waits for it). Idempotent.
  bool Drain(absl::Duration grace);

  BatcherStats stats() const;
  // The sizer's held batch size per layout key it remembers (BatchSizer::Held), for the metrics
  // scrape; kept out of stats(), which the answer pipeline reads once per batch.
  std::vector<std::pair<std::string, int64_t>> HeldBatchRows() const;

 private:
  struct Queued {
    std::unique_ptr<Task> task;
    absl::Time enqueued;
  };

  void WorkerLoop(bool lead);
  // Removes expired and cancelled tasks (returned to be failed outside the lock).
  std::vector<std::pair<std::unique_ptr<Task>, absl::Status>> SweepLocked(absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::unique_ptr<Task>> TakeBatchLocked(const std::string& key, int64_t queued_rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `batch` on 1 / `shares` of the machine and tells the sizer how long it computed.
  void RunBatch(std::vector<std::unique_ptr<Task>> batch, int shares);
  // Each queue's state for NextBatch; the earliest deadline of any queued task into `deadline`.
  std::vector<QueueState> StatesLocked(absl::Time* deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(const Task& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes a worker that may take a queued batch now, if any may.
  void WakeForQueuedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes every worker and Drain: the clock moved, or a drain began.
  void WakeAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatchOptions options_;
  const Runner runner_;
  const int worker_count_;
  Clock* const clock_;
  mutable absl::Mutex mu_;
  absl::CondVar lead_wake_;    // the lead waits on it for work
  absl::CondVar helper_wake_;  // the other workers wait on it for work
  absl::CondVar drain_wake_;   // Drain waits on it: a worker exited, or the clock moved
  std::map<std::string, std::deque<Queued>> queues_ ABSL_GUARDED_BY(mu_);
  BatchSizer sizer_ ABSL_GUARDED_BY(mu_);
  BatcherStats stats_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int running_workers_ ABSL_GUARDED_BY(mu_) = 0;
  int running_batches_ ABSL_GUARDED_BY(mu_) = 0;
  bool running_alone_ ABSL_GUARDED_BY(mu_) = false;  // a batch runs on the whole machine
  int64_t waker_id_ = 0;                             // of the clock's waker that wakes the workers
  std::vector<std::thread> workers_;
};

}  // namespace praxis::batching
