#pragma once

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace praxis::batching {

// The time the batcher schedules by: when tasks arrived, whether deadlines, delays and drain
// grace have passed, and how long a worker may sleep. Production uses RealClock(); tests use a
// FakeClock so that deadline, delay and drain tests take no real time.
//
// Thread-safe: every method may be called from any thread.
class Clock {
 public:
  // Called by a Clock whose time moved without real time passing (FakeClock::Advance), so that a
  // sleeper re-reads Now(). A waker may lock its owner's mutex; it must not call back the Clock's
  // AddWaker or RemoveWaker.
  using Waker = std::function<void()>;

  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // The longest a thread that waits for time `t` on this clock should sleep in real time before
  // reading Now() again: zero once `t` has come. A waker, if the clock calls any, ends it sooner.
  virtual absl::Duration RealTimeUntil(absl::Time t) const = 0;
  // Registers `wake` until RemoveWaker(id) (which returns only once no call of it runs). The real
  // clock never calls wakers.
  virtual int64_t AddWaker(Waker wake) = 0;
  virtual void RemoveWaker(int64_t id) = 0;
};

// absl::Now(); never calls a waker. A process-wide instance, never destroyed.
Clock* RealClock();

// A clock that stands still until Advance, for tests. Starts at `start`; RealTimeUntil is zero
// once a time has come and infinite before it, so a sleeper wakes only by Advance (through its
// waker) or by its own CondVar.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000));

  absl::Time Now() const override;
  absl::Duration RealTimeUntil(absl::Time t) const override;
  int64_t AddWaker(Waker wake) override;
  void RemoveWaker(int64_t id) override;

  // Moves the time forward by `d` (>= 0), then calls every waker.
  void Advance(absl::Duration d);

 private:
  // Lock order: wakers_mu_, then whatever a waker locks, then now_mu_ (Now() may be called with
  // the waker's owner's mutex held).
  absl::Mutex wakers_mu_;
  std::map<int64_t, Waker> wakers_ ABSL_GUARDED_BY(wakers_mu_);
  int64_t next_id_ ABSL_GUARDED_BY(wakers_mu_) = 0;
  mutable absl::Mutex now_mu_;
  absl::Time now_ ABSL_GUARDED_BY(now_mu_);
};

}  // namespace praxis::batching
