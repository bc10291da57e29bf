#include "server/batching/clock.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace praxis::batching {
namespace {

class SystemClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  absl::Duration RealTimeUntil(absl::Time t) const override {
    return std::max(t - absl::Now(), absl::ZeroDuration());
  }
  int64_t AddWaker(Waker) override { return 0; }
  void RemoveWaker(int64_t) override {}
};

}  // namespace

Clock* RealClock() {
  static Clock* const clock = new SystemClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&now_mu_);
  return now_;
}

absl::Duration FakeClock::RealTimeUntil(absl::Time t) const {
  return t <= Now() ? absl::ZeroDuration() : absl::InfiniteDuration();
}

int64_t FakeClock::AddWaker(Waker wake) {
  absl::MutexLock lock(&wakers_mu_);
  wakers_.emplace(next_id_, std::move(wake));
  return next_id_++;
}

void FakeClock::RemoveWaker(int64_t id) {
  absl::MutexLock lock(&wakers_mu_);
  wakers_.erase(id);
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&wakers_mu_);
  {
    absl::MutexLock now_lock(&now_mu_);
    now_ += std::max(d, absl::ZeroDuration());
  }
  // The time is updated first: a sleeper that reads Now() before its waker runs sees it.
  for (auto& [id, wake] : wakers_) wake();
}

}  // namespace praxis::batching
