#include "server/batching/batcher.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/batching/batch_policy.h"
#include "server/batching/batch_sizer.h"
#include "server/batching/clock.h"

namespace praxis::batching {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(NextBatchTest, ClosesOnSize) {
  const BatchOptions o{.max_batch_rows = 4, .max_queue_delay = absl::Milliseconds(10)};
  const std::vector<QueueState> q = {{"a", kT0, 4}};
  EXPECT_EQ(NextBatch(q, kT0, o).run, "a");
  const std::vector<QueueState> small = {{"a", kT0, 3}};
  const BatchDecision d = NextBatch(small, kT0 + absl::Milliseconds(2), o);
  EXPECT_FALSE(d.run);
  EXPECT_EQ(d.wake_at, kT0 + absl::Milliseconds(10));
}

TEST(NextBatchTest, ClosesOnDelay) {
  const BatchOptions o{.max_batch_rows = 4, .max_queue_delay = absl::Milliseconds(10)};
  const std::vector<QueueState> q = {{"a", kT0, 1}};
  EXPECT_FALSE(NextBatch(q, kT0 + absl::Milliseconds(9), o).run);
  EXPECT_EQ(NextBatch(q, kT0 + absl::Milliseconds(10), o).run, "a");
}

TEST(NextBatchTest, OldestReadyQueueGoesFirst) {
  const BatchOptions o{.max_batch_rows = 2, .max_queue_delay = absl::Milliseconds(10)};
  const std::vector<QueueState> q = {{"full-new", kT0 + absl::Milliseconds(5), 2},
                                     {"old", kT0, 1},
                                     {"young", kT0 + absl::Milliseconds(8), 1}};
  EXPECT_EQ(NextBatch(q, kT0 + absl::Milliseconds(11), o).run, "old");
  EXPECT_EQ(NextBatch(q, kT0 + absl::Milliseconds(6), o).run, "full-new");
}

TEST(NextBatchTest, ClosesOnCost) {
  const BatchOptions o{
      .max_batch_rows = 8, .max_queue_delay = absl::Milliseconds(10), .max_batch_cost = 5.0};
  const std::vector<QueueState> q = {{"a", kT0, 2, 5.0}};
  EXPECT_EQ(NextBatch(q, kT0, o).run, "a") << "a full batch's worth of work runs at once";
  const std::vector<QueueState> cheap = {{"a", kT0, 2, 4.0}};
  EXPECT_FALSE(NextBatch(cheap, kT0, o).run);
}

TEST(NextBatchTest, AQueueIsFullAtItsOwnSize) {
  const BatchOptions o{.max_batch_rows = 8, .max_queue_delay = absl::Milliseconds(10)};
  const std::vector<QueueState> q = {{"a", kT0, 2, 0, /*max_rows=*/2}};
  EXPECT_EQ(NextBatch(q, kT0, o).run, "a") << "the sizer holds this layout to 2 rows";
  const std::vector<QueueState> unsized = {{"a", kT0, 2}};
  EXPECT_FALSE(NextBatch(unsized, kT0, o).run);
}

// A closed loop as the sizer sees it: `queued` rows always wait, and a batch of n rows takes
// took(n). Returns the sizes of the last `tail` batches of `batches`.
template <typename Took>
std::vector<int64_t> Drive(BatchSizer& sizer, const std::string& key, int64_t queued, int batches,
                           Took took, int tail = 16) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < batches; ++i) {
    const int64_t n = std::min(queued, sizer.TakeRows(key, queued));
    sizer.Observe(key, n, took(n));
    if (i >= batches - tail) sizes.push_back(n);
  }
  return sizes;
}

int64_t Count(const std::vector<int64_t>& sizes, int64_t n) {
  return std::count(sizes.begin(), sizes.end(), n);
}

// Rows that cost the same alone as together (the medium layout on 2 cores: 25 ms a row at B1 and
// at B8): its batches come down to single rows, but for the probes.
TEST(BatchSizerTest, ALayoutThatBatchingDoesNotSpeedUpRunsARowAtATime) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 4});
  EXPECT_EQ(sizer.Rows("medium"), 8) << "a layout never measured may fill a batch";
  const auto tail =
      Drive(sizer, "medium", 8, 200, [](int64_t n) { return n * absl::Milliseconds(25); });
  EXPECT_EQ(sizer.Rows("medium"), 1);
  EXPECT_EQ(Count(tail, 1), 12) << "one batch in 4 probes 2 rows";
  EXPECT_EQ(Count(tail, 2), 4);
}

// Rows that batching amortises (a fixed cost per batch, as a short layout's): full batches stay.
TEST(BatchSizerTest, ALayoutThatBatchingSpeedsUpKeepsFullBatches) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 4});
  const auto tail = Drive(sizer, "small", 8, 200, [](int64_t n) {
    return absl::Milliseconds(3) + n * absl::Milliseconds(1);
  });
  EXPECT_EQ(sizer.Rows("small"), 8);
  EXPECT_EQ(Count(tail, 8), 12);
  EXPECT_EQ(Count(tail, 4), 4) << "the probes of the size below";
}

// Within the tolerance the smaller size wins (its callers wait less); past it, the faster one.
TEST(BatchSizerTest, TheFewestRowsWithinTheToleranceOfTheBest) {
  const auto per_row_at_8 = [](double eight_vs_four) {
    return [=](int64_t n) {
      return n >= 8 ? absl::Milliseconds(10 * 8 / eight_vs_four) : n * absl::Milliseconds(10);
    };
  };
  BatchSizer close({.max_rows = 8, .probe_every = 2});
  Drive(close, "a", 8, 100, per_row_at_8(1.05));  // 8 rows only 5 % faster per row than 4
  EXPECT_EQ(close.Rows("a"), 1) << "1, 2 and 4 rows are alike, 8 within the tolerance";
  BatchSizer far({.max_rows = 8, .probe_every = 2});
  Drive(far, "a", 8, 100, per_row_at_8(1.5));
  EXPECT_EQ(far.Rows("a"), 8);
}

// The machine's speed or load changes: a layout held to single rows climbs back, a probe at a
// time, once larger batches pay; and back down when they stop paying.
TEST(BatchSizerTest, FollowsTheCostWhenItChanges) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 4});
  const auto flat = [](int64_t n) { return n * absl::Milliseconds(25); };
  const auto amortised = [](int64_t n) {
    return absl::Milliseconds(20) + n * absl::Milliseconds(5);
  };
  Drive(sizer, "a", 8, 100, flat);
  ASSERT_EQ(sizer.Rows("a"), 1);
  Drive(sizer, "a", 8, 200, amortised);
  EXPECT_EQ(sizer.Rows("a"), 8);
  Drive(sizer, "a", 8, 300, flat);
  EXPECT_EQ(sizer.Rows("a"), 1);
}

// A short queue is never probed above what it holds: its batches are measured as they come.
TEST(BatchSizerTest, NeverProbesAboveTheQueue) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 1});
  const auto tail = Drive(sizer, "a", 1, 50, [](int64_t) { return absl::Milliseconds(5); });
  EXPECT_EQ(Count(tail, 1), 16);
  EXPECT_EQ(sizer.Rows("a"), 1);
  EXPECT_EQ(sizer.TakeRows("a", 3), 2) << "a deeper queue: the probe of the size above";
}

// One batch may meet a noisy moment of the host: a size counts once measured twice.
TEST(BatchSizerTest, OneFastBatchDoesNotMoveTheSize) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 1000});
  for (int i = 0; i < 3; ++i) sizer.Observe("a", 8, absl::Milliseconds(10));
  sizer.Observe("a", 4, absl::Milliseconds(2));
  EXPECT_EQ(sizer.Rows("a"), 8);
  sizer.Observe("a", 4, absl::Milliseconds(2));
  EXPECT_EQ(sizer.Rows("a"), 4);
}

// A size's first batch may pay for a warm-up (a CUDA graph captured for it): it does not count
// against the size once a second batch has run.
TEST(BatchSizerTest, ASizesFirstBatchMayBeItsWarmUp) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 1000});
  for (int i = 0; i < 3; ++i) sizer.Observe("a", 1, absl::Milliseconds(10));
  ASSERT_EQ(sizer.Rows("a"), 1);
  sizer.Observe("a", 2, absl::Milliseconds(500));  // captured
  sizer.Observe("a", 2, absl::Milliseconds(11));
  EXPECT_EQ(sizer.Rows("a"), 2) << "2 rows in 11 ms against 1 in 10";
}

TEST(BatchSizerTest, OffEveryBatchMayFill) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 0});
  Drive(sizer, "a", 8, 50, [](int64_t n) { return n * absl::Milliseconds(25); });
  EXPECT_EQ(sizer.Rows("a"), 8);
  EXPECT_EQ(sizer.TakeRows("a", 8), 8);
  EXPECT_TRUE(sizer.Held().empty()) << "nothing held: no series to report";
}

// BatchSizer::Held's answer: (layout key, held rows), in key order.
using Held = std::vector<std::pair<std::string, int64_t>>;

// Layouts are the clients' to choose: the sizes of at most max_keys are remembered.
TEST(BatchSizerTest, RemembersAtMostMaxKeysLayouts) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 4, .max_keys = 2});
  const auto flat = [](int64_t n) { return n * absl::Milliseconds(25); };
  Drive(sizer, "a", 8, 100, flat);
  Drive(sizer, "b", 8, 100, flat);
  ASSERT_EQ(sizer.Rows("a"), 1);
  Drive(sizer, "c", 8, 100, flat);  // "a" was used least recently
  EXPECT_EQ(sizer.Rows("a"), 8) << "forgotten: measured again from full batches";
  EXPECT_EQ(sizer.Rows("b"), 1);
  EXPECT_EQ(sizer.Rows("c"), 1);
  EXPECT_EQ(sizer.Held(), (Held{{"b", 1}, {"c", 1}})) << "what the metrics report: not \"a\"";
}

// What praxis_batch_rows_held reports: each layout's own size, where batching pays and where not.
TEST(BatchSizerTest, HeldSaysEachLayoutsSize) {
  BatchSizer sizer({.max_rows = 8, .probe_every = 4});
  EXPECT_EQ(sizer.Held(), Held{});
  Drive(sizer, "long", 8, 100, [](int64_t n) { return n * absl::Milliseconds(25); });
  Drive(sizer, "short", 8, 100,
        [](int64_t n) { return absl::Milliseconds(20) + n * absl::Milliseconds(5); });
  EXPECT_EQ(sizer.Held(), (Held{{"long", 1}, {"short", 8}}));
}

// A task that records its final answer.
class FakeTask : public Task {
 public:
  FakeTask(std::string key, int64_t rows, absl::Time deadline = absl::InfiniteFuture(),
           double cost = 0)
      : key_(std::move(key)), rows_(rows), deadline_(deadline), cost_(cost) {}
  const std::string& layout_key() const override { return key_; }
  int64_t rows() const override { return rows_; }
  int64_t bytes() const override { return 100 * rows_; }
  double cost() const override { return cost_; }
  absl::Time deadline() const override { return deadline_; }
  bool cancelled() const override { return cancelled_; }
  void Fail(absl::Status s) override {
    ++answers;
    failure = s;
    done.Notify();
  }
  void Complete() {
    ++answers;
    done.Notify();
  }
  std::atomic<bool> cancelled_ = false;
  std::atomic<int> answers = 0;
  absl::Status failure;
  absl::Notification done;

 private:
  std::string key_;
  int64_t rows_;
  absl::Time deadline_;
  double cost_;
};

// What the batcher owns: a forwarder to a FakeTask the test owns, so the test can read a task's
// answer after the batcher has dropped it.
class ProxyTask : public Task {
 public:
  explicit ProxyTask(FakeTask* t) : t_(t) {}
  const std::string& layout_key() const override { return t_->layout_key(); }
  int64_t rows() const override { return t_->rows(); }
  int64_t bytes() const override { return t_->bytes(); }
  double cost() const override { return t_->cost(); }
  absl::Time deadline() const override { return t_->deadline(); }
  bool cancelled() const override { return t_->cancelled(); }
  void Fail(absl::Status s) override { t_->Fail(std::move(s)); }
  FakeTask* target() const { return t_; }

 private:
  FakeTask* t_;
};

// Records each batch as (key, rows per task) and its shares, and completes its tasks.
struct RecordingRunner {
  absl::Duration operator()(std::vector<std::unique_ptr<Task>> batch, int batch_shares) {
    std::vector<int64_t> rows;
    for (auto& t : batch) rows.push_back(t->rows());
    {
      absl::MutexLock lock(&mu);
      batches.push_back({batch.front()->layout_key(), rows});
      shares.push_back(batch_shares);
    }
    if (gate) gate->WaitForNotification();
    for (auto& t : batch) static_cast<ProxyTask*>(t.get())->target()->Complete();
    return absl::ZeroDuration();
  }
  absl::Mutex mu;
  std::vector<std::pair<std::string, std::vector<int64_t>>> batches;
  std::vector<int> shares;
  absl::Notification* gate = nullptr;
};

// Waits (bounded) until the workers have taken `n` batches in all, i.e. the runner holds them.
bool WaitForBatches(const Batcher& b, int64_t n = 1) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (b.stats().batches < n) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// The test's tasks, alive for the whole test binary. Submitters run on several threads at once
// (ManyConcurrentSubmitters), so the arena has its own lock: ThreadSanitizer caught the unguarded
// push_back racing with itself.
class Arena {
 public:
  static FakeTask* Keep(std::unique_ptr<FakeTask> t) {
    static auto* arena = new Arena();
    absl::MutexLock lock(&arena->mu_);
    arena->tasks_.push_back(std::move(t));
    return arena->tasks_.back().get();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<FakeTask>> tasks_ ABSL_GUARDED_BY(mu_);
};

// Submits `t` through a proxy; the test keeps the FakeTask to read its answer.
FakeTask* Submit(Batcher& b, std::unique_ptr<FakeTask> t, absl::Status* status = nullptr) {
  FakeTask* raw = Arena::Keep(std::move(t));
  std::unique_ptr<Task> task = std::make_unique<ProxyTask>(raw);
  absl::Status s = b.Submit(task);
  if (status) *status = s;
  EXPECT_EQ(task == nullptr, s.ok()) << "a refused task is handed back";
  return raw;
}

TEST(BatcherTest, GroupsByLayoutKeyAndClosesOnSize) {
  RecordingRunner runner;
  std::vector<FakeTask*> tasks;
  {
    Batcher b({.max_batch_rows = 2, .max_queue_delay = absl::Seconds(10)}, std::ref(runner));
    for (int i = 0; i < 4; ++i) tasks.push_back(Submit(b, std::make_unique<FakeTask>("a", 1)));
    tasks.push_back(Submit(b, std::make_unique<FakeTask>("b", 2)));
    for (FakeTask* t : tasks) t->done.WaitForNotificationWithTimeout(absl::Seconds(10));
  }
  ASSERT_EQ(runner.batches.size(), 3u);
  for (const auto& [key, rows] : runner.batches) {
    int64_t n = 0;
    for (int64_t r : rows) n += r;
    EXPECT_EQ(n, 2) << key;
  }
  for (FakeTask* t : tasks) EXPECT_EQ(t->answers, 1);
}

TEST(BatcherTest, ClosesOnDelayWithAPartialBatch) {
  FakeClock clock;
  RecordingRunner runner;
  Batcher b({.max_batch_rows = 8, .max_queue_delay = absl::Milliseconds(20)}, std::ref(runner),
            /*workers=*/1, &clock);
  FakeTask* t = Submit(b, std::make_unique<FakeTask>("a", 3));
  clock.Advance(absl::Milliseconds(19));
  EXPECT_FALSE(t->done.WaitForNotificationWithTimeout(absl::Milliseconds(10)))
      << "ran before its delay";
  clock.Advance(absl::Milliseconds(1));
  ASSERT_TRUE(t->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&runner.mu);
  ASSERT_EQ(runner.batches.size(), 1u);
  EXPECT_EQ(runner.batches[0].second, std::vector<int64_t>{3});
}

TEST(BatcherTest, MultiRowTaskIsNeverSplit) {
  RecordingRunner runner;
  absl::Notification gate;
  runner.gate = &gate;
  std::vector<FakeTask*> tasks;
  {
    Batcher b({.max_batch_rows = 4, .max_queue_delay = absl::Milliseconds(1)}, std::ref(runner));
    tasks.push_back(Submit(b, std::make_unique<FakeTask>("a", 3)));
    tasks.push_back(Submit(b, std::make_unique<FakeTask>("a", 3)));
    tasks.push_back(Submit(b, std::make_unique<FakeTask>("a", 6)));  // larger than a batch: alone
    gate.Notify();
    for (FakeTask* t : tasks) t->done.WaitForNotificationWithTimeout(absl::Seconds(10));
  }
  for (const auto& [key, rows] : runner.batches) {
    if (rows.size() > 1) {
      int64_t n = 0;
      for (int64_t r : rows) n += r;
      EXPECT_LE(n, 4);
    }
  }
  for (FakeTask* t : tasks) EXPECT_EQ(t->answers, 1);
}

// Rows would allow one batch of 4; the cost budget splits them so no batch exceeds it, and a task
// over the budget on its own still runs, alone.
TEST(BatcherTest, BatchCostNeverExceedsTheBudget) {
  RecordingRunner runner;
  absl::Notification gate;
  runner.gate = &gate;
  std::vector<FakeTask*> tasks;
  {
    Batcher b({.max_batch_rows = 8, .max_queue_delay = absl::Seconds(10), .max_batch_cost = 5},
              std::ref(runner));
    for (double cost : {2.0, 2.0, 2.0, 9.0}) {
      tasks.push_back(Submit(b, std::make_unique<FakeTask>("a", 1, absl::InfiniteFuture(), cost)));
    }
    gate.Notify();
    for (FakeTask* t : tasks) t->done.WaitForNotificationWithTimeout(absl::Seconds(10));
  }
  absl::MutexLock lock(&runner.mu);
  std::vector<size_t> sizes;
  for (const auto& [key, rows] : runner.batches) sizes.push_back(rows.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{2, 1, 1})) << "2+2 fit in 5; 2+9 does not";
  for (FakeTask* t : tasks) EXPECT_EQ(t->answers, 1);
}

TEST(BatcherTest, FullQueueRefusesAtOnce) {
  RecordingRunner runner;
  absl::Notification gate;
  runner.gate = &gate;
  Batcher b({.max_batch_rows = 1, .max_queue_delay = absl::ZeroDuration(), .max_queue_requests = 2},
            std::ref(runner));
  FakeTask* running = Submit(b, std::make_unique<FakeTask>("a", 1));
  // Wait until the worker holds the first task, so the queue is empty again.
  ASSERT_TRUE(WaitForBatches(b));
  absl::Status s1, s2, s3;
  FakeTask* q1 = Submit(b, std::make_unique<FakeTask>("a", 1), &s1);
  FakeTask* q2 = Submit(b, std::make_unique<FakeTask>("b", 1), &s2);
  FakeTask* refused = Submit(b, std::make_unique<FakeTask>("c", 1), &s3);
  EXPECT_TRUE(s1.ok() && s2.ok());
  EXPECT_EQ(s3.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused->answers, 0) << "a refused task is handed back, not answered";
  gate.Notify();
  for (FakeTask* t : {running, q1, q2}) {
    ASSERT_TRUE(t->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(t->answers, 1);
  }
}

TEST(BatcherTest, ExpiredTaskIsFailedAndNeverRun) {
  FakeClock clock;
  RecordingRunner runner;
  absl::Notification gate;
  runner.gate = &gate;
  Batcher b({.max_batch_rows = 1, .max_queue_delay = absl::ZeroDuration()}, std::ref(runner),
            /*workers=*/1, &clock);
  FakeTask* blocker = Submit(b, std::make_unique<FakeTask>("a", 1));
  ASSERT_TRUE(WaitForBatches(b));
  FakeTask* late =
      Submit(b, std::make_unique<FakeTask>("b", 1, clock.Now() + absl::Milliseconds(5)));
  clock.Advance(absl::Milliseconds(20));  // past its deadline while the worker is busy
  gate.Notify();
  ASSERT_TRUE(late->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(late->failure.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late->answers, 1);
  ASSERT_TRUE(blocker->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&runner.mu);
  EXPECT_EQ(runner.batches.size(), 1u) << "the expired task never reached the runner";
  EXPECT_EQ(b.stats().expired, 1);
}

TEST(BatcherTest, CancelledTaskIsDropped) {
  RecordingRunner runner;
  Batcher b({.max_batch_rows = 8, .max_queue_delay = absl::Seconds(10)}, std::ref(runner));
  FakeTask* t = Submit(b, std::make_unique<FakeTask>("a", 1));
  t->cancelled_ = true;
  ASSERT_TRUE(t->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(t->failure.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(b.stats().queued_requests, 0);
}

TEST(BatcherTest, DrainRunsQueuedWorkThenRefusesNewWork) {
  FakeClock clock;
  RecordingRunner runner;
  Batcher b({.max_batch_rows = 8, .max_queue_delay = absl::Seconds(60)}, std::ref(runner),
            /*workers=*/1, &clock);
  std::vector<FakeTask*> tasks;
  for (int i = 0; i < 5; ++i)
    tasks.push_back(Submit(b, std::make_unique<FakeTask>("k" + std::to_string(i % 2), 1)));
  b.Drain(absl::Seconds(10));
  for (FakeTask* t : tasks) {
    EXPECT_TRUE(t->done.HasBeenNotified());
    EXPECT_EQ(t->answers, 1);
    EXPECT_TRUE(t->failure.ok()) << "queued work finishes within the grace period";
  }
  absl::Status s;
  FakeTask* after = Submit(b, std::make_unique<FakeTask>("a", 1), &s);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(after->answers, 0);
}

// A batch that outlives the grace is left running; what is still queued then is failed UNAVAILABLE
// and never run.
TEST(BatcherTest, DrainFailsWhatIsQueuedOnceTheGraceHasPassed) {
  FakeClock clock;
  RecordingRunner runner;
  absl::Notification gate;
  runner.gate = &gate;
  Batcher b({.max_batch_rows = 1, .max_queue_delay = absl::ZeroDuration()}, std::ref(runner),
            /*workers=*/1, &clock);
  FakeTask* running = Submit(b, std::make_unique<FakeTask>("a", 1));
  ASSERT_TRUE(WaitForBatches(b));
  FakeTask* queued = Submit(b, std::make_unique<FakeTask>("a", 1));
  absl::Notification drained;
  std::thread advancer([&] {
    // Drain reads its deadline on the clock when it begins: step past it until Drain returns.
    for (int i = 0; i < 10000 && !drained.HasBeenNotified(); ++i) {
      clock.Advance(absl::Seconds(31));
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  const bool all_exited = b.Drain(absl::Seconds(30));
  drained.Notify();
  advancer.join();
  EXPECT_FALSE(all_exited) << "the running batch outlived the grace";
  gate.Notify();
  ASSERT_TRUE(queued->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(queued->failure.code(), absl::StatusCode::kUnavailable) << queued->failure;
  EXPECT_EQ(queued->answers, 1);
  ASSERT_TRUE(running->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(running->failure.ok());
  absl::MutexLock lock(&runner.mu);
  EXPECT_EQ(runner.batches.size(), 1u) << "the queued task never reached the runner";
}

// 8 threads submit 8 one-row tasks each over 3 keys to a batcher of 2 workers with `options`;
// every task is answered exactly once. Returns the batches run.
std::vector<std::pair<std::string, std::vector<int64_t>>> SubmitConcurrently(BatchOptions options) {
  RecordingRunner runner;
  std::vector<FakeTask*> tasks(64);
  {
    Batcher b(options, std::ref(runner), 2);
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i) {
      threads.emplace_back([&, i] {
        for (int j = 0; j < 8; ++j) {
          tasks[i * 8 + j] = Submit(b, std::make_unique<FakeTask>("k" + std::to_string(j % 3), 1));
        }
      });
    }
    for (auto& t : threads) t.join();
    for (FakeTask* t : tasks)
      EXPECT_TRUE(t->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  for (FakeTask* t : tasks) EXPECT_EQ(t->answers, 1);
  absl::MutexLock lock(&runner.mu);
  return runner.batches;
}

// A batch with none other ready or running has the whole machine: a second worker leaves the next
// batch queued until it ends, and that one, alone again, has the whole machine too.
TEST(BatcherTest, ALoneBatchHasTheMachineToItself) {
  RecordingRunner runner;
  absl::Notification gate;
  runner.gate = &gate;
  Batcher b({.max_batch_rows = 1}, std::ref(runner), /*workers=*/2);
  FakeTask* first = Submit(b, std::make_unique<FakeTask>("a", 1));
  ASSERT_TRUE(WaitForBatches(b));
  FakeTask* second = Submit(b, std::make_unique<FakeTask>("a", 1));
  absl::SleepFor(absl::Milliseconds(100));  // time for an idle worker to take it, were it allowed
  EXPECT_EQ(b.stats().batches, 1) << "the idle worker started a batch beside a lone one";
  EXPECT_EQ(b.stats().queued_requests, 1);
  gate.Notify();
  for (FakeTask* t : {first, second}) {
    ASSERT_TRUE(t->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  absl::MutexLock lock(&runner.mu);
  EXPECT_EQ(runner.shares, (std::vector<int>{1, 1}));
}

// Batches ready together run side by side, each on its share.
TEST(BatcherTest, BatchesReadyTogetherRunSideBySideOnShares) {
  FakeClock clock;
  RecordingRunner runner;
  absl::Notification gate;
  runner.gate = &gate;
  Batcher b({.max_batch_rows = 2, .max_queue_delay = absl::Seconds(1)}, std::ref(runner),
            /*workers=*/2, &clock);
  std::vector<FakeTask*> tasks;
  tasks.push_back(Submit(b, std::make_unique<FakeTask>("a", 1)));
  tasks.push_back(Submit(b, std::make_unique<FakeTask>("b", 1)));
  clock.Advance(absl::Seconds(1));  // both partial batches are ready at once
  const bool side_by_side = WaitForBatches(b, 2);
  gate.Notify();
  EXPECT_TRUE(side_by_side) << "the second ready batch waited for the first";
  for (FakeTask* t : tasks) ASSERT_TRUE(t->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&runner.mu);
  EXPECT_EQ(runner.shares, (std::vector<int>{2, 2}));
}

TEST(BatcherTest, ManyConcurrentSubmittersEachAnsweredExactlyOnce) {
  bool some_batch_above_one = false;
  for (const auto& [key, rows] :
       SubmitConcurrently({.max_batch_rows = 4, .max_queue_delay = absl::Milliseconds(2)})) {
    some_batch_above_one |= rows.size() > 1;
  }
  EXPECT_TRUE(some_batch_above_one);
}

// The sizer in the batcher: a runner whose rows compute for 10 ms each however they are batched,
// and then take a second of the batcher's clock to answer. The sizer learns from the compute the
// runner reports (the clock would favour full batches): batches of a deep queue shrink to single
// rows.
TEST(BatcherTest, BatchesOfALayoutThatDoesNotBatchShrinkToSingleRows) {
  FakeClock clock;
  std::vector<int64_t> sizes;
  absl::Mutex mu;
  absl::Notification all_queued;  // the first batch waits for the rest to queue behind it
  auto runner = [&](std::vector<std::unique_ptr<Task>> batch, int /*shares*/) {
    all_queued.WaitForNotification();
    int64_t rows = 0;
    for (auto& t : batch) rows += t->rows();
    clock.Advance(rows * absl::Milliseconds(10) + absl::Seconds(1));
    {
      absl::MutexLock lock(&mu);
      sizes.push_back(rows);
    }
    for (auto& t : batch) static_cast<ProxyTask*>(t.get())->target()->Complete();
    return rows * absl::Milliseconds(10);
  };
  std::vector<FakeTask*> tasks;
  {
    Batcher b({.max_batch_rows = 8, .max_queue_requests = 4096, .batch_probe_every = 2}, runner,
              /*workers=*/1, &clock);
    for (int i = 0; i < 200; ++i) tasks.push_back(Submit(b, std::make_unique<FakeTask>("a", 1)));
    all_queued.Notify();
    for (FakeTask* t : tasks)
      ASSERT_TRUE(t->done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  for (FakeTask* t : tasks) EXPECT_EQ(t->answers, 1);
  absl::MutexLock lock(&mu);
  ASSERT_GE(sizes.size(), 20u);
  EXPECT_EQ(*std::max_element(sizes.begin(), sizes.begin() + 4), 8)
      << "unmeasured, a batch of the deep queue fills";
  int64_t single = 0;
  for (size_t i = sizes.size() - 10; i < sizes.size(); ++i) single += sizes[i] == 1;
  EXPECT_GE(single, 5) << "the last ten batches: single rows but for probes of 2";
}

TEST(BatcherTest, ConcurrentSubmittersWithTheSizerEachAnsweredExactlyOnce) {
  SubmitConcurrently(
      {.max_batch_rows = 4, .max_queue_delay = absl::Milliseconds(2), .batch_probe_every = 1});
}

}  // namespace
}  // namespace praxis::batching
