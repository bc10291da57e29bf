#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/step_runner.h"

namespace praxis::serve::fixtures {

// A StepRunner around the real model that can hold batches at a gate (so tests can fill queues,
// let deadlines pass or cancel calls while a batch is known to be running) and counts what ran.
// Thread-safe.
class GatedRunner : public model::StepRunner {
 public:
  explicit GatedRunner(std::unique_ptr<model::StepRunner> inner) : inner_(std::move(inner)) {}

  void Close() {
    absl::MutexLock l(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock l(&mu_);
    open_ = true;
  }
  // The next batch throws from Run, as a LibTorch failure would.
  void ThrowNext() {
    absl::MutexLock l(&mu_);
    throw_next_ = true;
  }
  // Waits (bounded) until `n` batches in all have entered Run.
  bool WaitEntered(int64_t n, absl::Duration timeout = absl::Seconds(60)) {
    absl::MutexLock l(&mu_);
    const auto reached = [this, n]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return entered_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  int64_t batches_entered() const {
    absl::MutexLock l(&mu_);
    return entered_;
  }
  int64_t rows_run() const {
    absl::MutexLock l(&mu_);
    return rows_;
  }

  absl::StatusOr<model::BackboneOutput> Run(const model::StepInputs& batch) override {
    {
      absl::MutexLock l(&mu_);
      ++entered_;
      // Bounded, so that a broken test cannot hang the suite.
      mu_.AwaitWithTimeout(absl::Condition(&open_), absl::Seconds(120));
      rows_ += batch.noised.size(0);
      if (std::exchange(throw_next_, false)) throw std::runtime_error("injected failure");
    }
    return inner_->Run(batch);
  }
  const model::BackboneConfig& config() const override { return inner_->config(); }
  model::MaskCacheStats mask_cache_stats() const override { return inner_->mask_cache_stats(); }
  std::string device() const override { return inner_->device(); }
  std::string dtype() const override { return inner_->dtype(); }
  std::optional<int64_t> device_memory_bytes() const override {
    return inner_->device_memory_bytes();
  }

 private:
  std::unique_ptr<model::StepRunner> inner_;
  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool throw_next_ ABSL_GUARDED_BY(mu_) = false;
  int64_t entered_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rows_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace praxis::serve::fixtures
