#include "server/batching/batcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace praxis::batching {
namespace {

// A worker looks at its queued tasks at least this often (real time): cancellation is not
// signalled, so it is noticed by looking.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

Batcher::Batcher(BatchOptions options, Runner runner, int workers, Clock* clock)
    : options_(options),
      runner_(std::move(runner)),
      worker_count_(std::max(1, workers)),
      clock_(clock),
      sizer_({.max_rows = options.max_batch_rows,
              .probe_every = options.batch_probe_every,
              .max_keys = options.max_sized_layouts}) {
  waker_id_ = clock_->AddWaker([this] {
    absl::MutexLock lock(&mu_);
    WakeAllLocked();
  });
  running_workers_ = worker_count_;
  for (int i = 0; i < worker_count_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i == 0); });
}

Batcher::~Batcher() {
  Drain(absl::ZeroDuration());
  for (std::thread& w : workers_) w.join();
  clock_->RemoveWaker(waker_id_);
}

absl::Status Batcher::Submit(std::unique_ptr<Task>& task) {
  if (task->rows() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch rows must be >= 1, got ", task->rows()));
  }
  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("server is draining");
  if (stats_.queued_requests + 1 > options_.max_queue_requests ||
      stats_.queued_bytes + task->bytes() > options_.max_queue_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("queue full: ", stats_.queued_requests, " requests and ", stats_.queued_bytes,
                     " bytes queued (limits ", options_.max_queue_requests, " and ",
                     options_.max_queue_bytes, ")"));
  }
  ++stats_.queued_requests;
  stats_.queued_bytes += task->bytes();
  const std::string key = task->layout_key();
  queues_[key].push_back({std::move(task), clock_->Now()});
  WakeForQueuedLocked();
  return absl::OkStatus();
}

void Batcher::WakeAllLocked() {
  lead_wake_.SignalAll();
  helper_wake_.SignalAll();
  drain_wake_.SignalAll();
}

void Batcher::WakeForQueuedLocked() {
  if (running_alone_) return;                       // its end wakes a worker
  lead_wake_.Signal();                              // alone, or beside what runs
  if (running_batches_ > 0) helper_wake_.Signal();  // beside what runs, if the lead is busy
}

void Batcher::Forget(const Task& t) {
  --stats_.queued_requests;
  stats_.queued_bytes -= t.bytes();
}

std::vector<std::pair<std::unique_ptr<Task>, absl::Status>> Batcher::SweepLocked(absl::Time now) {
  std::vector<std::pair<std::unique_ptr<Task>, absl::Status>> dropped;
  for (auto it = queues_.begin(); it != queues_.end();) {
    std::deque<Queued> kept;
    for (Queued& q : it->second) {
      absl::Status why;
      // The deadline first: gRPC also cancels a call whose deadline passed.
      if (q.task->deadline() <= now) {
        why = absl::DeadlineExceededError("deadline passed while queued; not computed");
        ++stats_.expired;
      } else if (q.task->cancelled()) {
        why = absl::CancelledError("cancelled while queued");
        ++stats_.cancelled;
      } else if (draining_ && now >= drain_deadline_) {
        why = absl::UnavailableError("server shut down before this request ran");
      }
      if (why.ok()) {
        kept.push_back(std::move(q));
      } else {
        Forget(*q.task);
        dropped.emplace_back(std::move(q.task), why);
      }
    }
    it->second = std::move(kept);
    it = it->second.empty() ? queues_.erase(it) : std::next(it);
  }
  return dropped;
}

std::vector<std::unique_ptr<Task>> Batcher::TakeBatchLocked(const std::string& key,
                                                            int64_t queued_rows) {
  std::deque<Queued>& q = queues_[key];
  std::vector<std::unique_ptr<Task>> batch;
  const int64_t max_rows = sizer_.TakeRows(key, queued_rows);
  int64_t rows = 0;
  double cost = 0;
  while (!q.empty() &&
         (batch.empty() || (rows + q.front().task->rows() <= max_rows &&
                            cost + q.front().task->cost() <= options_.max_batch_cost))) {
    rows += q.front().task->rows();
    cost += q.front().task->cost();
    Forget(*q.front().task);
    batch.push_back(std::move(q.front().task));
    q.pop_front();
  }
  if (q.empty()) queues_.erase(key);
  ++stats_.batches;
  return batch;
}

std::vector<QueueState> Batcher::StatesLocked(absl::Time* deadline) const {
  std::vector<QueueState> states;
  for (const auto& [key, q] : queues_) {
    int64_t rows = 0;
    double cost = 0;
    for (const Queued& t : q) {
      rows += t.task->rows();
      cost += t.task->cost();
      *deadline = std::min(*deadline, t.task->deadline());
    }
    states.push_back({key, q.front().enqueued, rows, cost, sizer_.Rows(key)});
  }
  return states;
}

void Batcher::WorkerLoop(bool lead) {
  while (true) {
    std::vector<std::pair<std::unique_ptr<Task>, absl::Status>> dropped;
    std::vector<std::unique_ptr<Task>> batch;
    int shares = 1;
    bool exit = false;
    {
      absl::MutexLock lock(&mu_);
      const absl::Time now = clock_->Now();
      dropped = SweepLocked(now);
      absl::Time earliest_deadline = absl::InfiniteFuture();
      std::vector<QueueState> states = StatesLocked(&earliest_deadline);
      BatchOptions policy = options_;
      if (draining_) policy.max_queue_delay = absl::ZeroDuration();  // run everything now
      // Nothing starts beside a batch that runs alone; only the lead starts one that may.
      const bool may_take = !running_alone_ && (lead || running_batches_ > 0);
      const BatchDecision d = may_take ? NextBatch(states, now, policy) : BatchDecision{};
      if (d.run) {
        const auto it = std::find_if(states.begin(), states.end(),
                                     [&](const QueueState& q) { return q.key == *d.run; });
        batch = TakeBatchLocked(*d.run, it->rows);
        // A lone worker has no one to share with: no second pass over the queues.
        absl::Time unused = absl::InfiniteFuture();
        const bool another_ready =
            worker_count_ > 1 && NextBatch(StatesLocked(&unused), now, policy).run.has_value();
        if (running_batches_ > 0 || another_ready) {
          shares = worker_count_;
          if (another_ready) helper_wake_.Signal();
        } else {
          running_alone_ = true;
        }
        ++running_batches_;
      } else if (draining_ && queues_.empty()) {
        exit = true;
      } else if (dropped.empty()) {
        // Wake for the next batch, the next deadline, a Submit, a batch's end or a drain.
        // Cancellation is noticed at the latest by the next wake; bound the wait so it is noticed
        // promptly.
        const absl::Time wake = std::min({d.wake_at, earliest_deadline, drain_deadline_});
        (lead ? lead_wake_ : helper_wake_)
            .WaitWithTimeout(&mu_, std::min(clock_->RealTimeUntil(wake), kCancelPoll));
      }
    }
    for (auto& [task, why] : dropped) task->Fail(why);
    if (!batch.empty()) RunBatch(std::move(batch), shares);
    if (exit) {
      absl::MutexLock lock(&mu_);
      --running_workers_;
      drain_wake_.SignalAll();
      return;
    }
  }
}

void Batcher::RunBatch(std::vector<std::unique_ptr<Task>> batch, int shares) {
  const std::string key = batch.front()->layout_key();
  int64_t rows = 0;
  for (const auto& t : batch) rows += t->rows();
  const absl::Time start = clock_->Now();
  absl::Duration took = runner_(std::move(batch), shares);
  if (took <= absl::ZeroDuration()) took = clock_->Now() - start;
  absl::MutexLock lock(&mu_);
  --running_batches_;
  if (shares == 1) running_alone_ = false;
  if (!queues_.empty()) WakeForQueuedLocked();  // what waited on this batch
  // The whole machine's time for the batch, so that sizes run alone and beside others compare.
  if (options_.batch_probe_every > 0) sizer_.Observe(key, rows, took / shares);
}

bool Batcher::Drain(absl::Duration grace) {
  absl::MutexLock lock(&mu_);
  if (!draining_) {
    draining_ = true;
    drain_deadline_ = clock_->Now() + grace;
  }
  WakeAllLocked();
  // Bounded: a batch that outlives the grace is left running (the process is about to exit).
  while (running_workers_ > 0 && clock_->Now() < drain_deadline_) {
    drain_wake_.WaitWithTimeout(&mu_, clock_->RealTimeUntil(drain_deadline_));
  }
  return running_workers_ == 0;
}

BatcherStats Batcher::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::vector<std::pair<std::string, int64_t>> Batcher::HeldBatchRows() const {
  absl::MutexLock lock(&mu_);
  return sizer_.Held();
}

}  // namespace praxis::batching
