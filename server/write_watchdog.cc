#include "server/write_watchdog.h"

#include <algorithm>
#include <utility>

namespace praxis::serve {

void WriteWatchdog::Clock::WriteStarted() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  since_ = absl::Now();
}

void WriteWatchdog::Clock::WriteDone() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  since_ = absl::InfiniteFuture();
}

void WriteWatchdog::Clock::CallDone() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  ctx_ = nullptr;
}

WriteWatchdog::WriteWatchdog(absl::Duration timeout) : timeout_(timeout) {
  if (timeout_ != absl::InfiniteDuration()) thread_ = std::thread([this] { Loop(); });
}

WriteWatchdog::~WriteWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<WriteWatchdog::Clock> WriteWatchdog::Watch(grpc::ServerContextBase* ctx) {
  auto clock = std::make_shared<Clock>(ctx);
  if (!thread_.joinable()) return clock;
  absl::MutexLock lock(&mu_);
  clocks_.push_back(clock);
  return clock;
}

int64_t WriteWatchdog::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool WriteWatchdog::Check(Clock& c, absl::Time now) {
  std::lock_guard<std::recursive_mutex> lock(c.mu_);  // keeps ctx_ alive through TryCancel
  if (c.ctx_ == nullptr) return false;
  if (now - c.since_ < timeout_) return true;
  c.since_ = absl::InfiniteFuture();
  c.ctx_->TryCancel();  // the pending write fails; the reactor ends the call and frees its answer
  absl::MutexLock count(&mu_);
  ++cancelled_;
  return true;
}

void WriteWatchdog::Loop() {
  const absl::Duration tick =
      std::clamp(timeout_ / 4, absl::Milliseconds(10), absl::Milliseconds(250));
  while (true) {
    std::vector<std::shared_ptr<Clock>> clocks;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), tick)) return;
      clocks = clocks_;
    }
    std::vector<Clock*> finished;
    const absl::Time now = absl::Now();
    for (const auto& c : clocks) {
      if (!Check(*c, now)) finished.push_back(c.get());
    }
    absl::MutexLock lock(&mu_);
    std::erase_if(clocks_, [&](const auto& c) {
      return std::find(finished.begin(), finished.end(), c.get()) != finished.end();
    });
  }
}

}  // namespace praxis::serve
