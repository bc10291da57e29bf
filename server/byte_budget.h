#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace praxis::serve {

// A bound on bytes held on behalf of callers (praxis-server: answers planned, computed or being
// written but not yet taken by their readers, and the texts sessions keep). A step reserves its
// answer's size before it is queued, and is refused when the reservation does not fit, so an
// answer nobody reads is never computed beyond the bound. Thread-safe; must outlive its
// reservations.
class ByteBudget {
 public:
  // Holds `bytes` of a budget until destroyed (or moved from). Not thread-safe itself.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept { *this = std::move(o); }
    Reservation& operator=(Reservation&& o) noexcept {
      Release();
      budget_ = std::exchange(o.budget_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      return *this;
    }
    ~Reservation() { Release(); }
    void Release() {
      if (budget_ != nullptr) budget_->Give(bytes_);
      budget_ = nullptr;
      bytes_ = 0;
    }
    int64_t bytes() const { return bytes_; }

   private:
    friend class ByteBudget;
    Reservation(ByteBudget* b, int64_t bytes) : budget_(b), bytes_(bytes) {}
    ByteBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  // `name` is the flag that sets `limit` and `what` what the bytes hold, for the error message.
  ByteBudget(int64_t limit, std::string name, std::string what)
      : limit_(limit), name_(std::move(name)), what_(std::move(what)) {}

  // `bytes` of the budget, or ResourceExhausted naming the limit when they do not fit.
  absl::StatusOr<Reservation> Reserve(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    if (bytes > limit_ - used_) {
      return absl::ResourceExhaustedError(absl::StrCat(what_, ": ", used_,
                                                       " bytes, and this one needs ", bytes,
                                                       " more (", name_, "=", limit_, ")"));
    }
    used_ += bytes;
    return Reservation(this, bytes);
  }

  int64_t used() const {
    absl::MutexLock lock(&mu_);
    return used_;
  }

  // Waits until nothing is reserved, or `deadline`; true if nothing is.
  bool AwaitEmpty(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return used_ == 0; };
    return mu_.AwaitWithDeadline(absl::Condition(&empty), deadline);
  }

 private:
  void Give(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    used_ -= bytes;
  }

  const int64_t limit_;
  const std::string name_;
  const std::string what_;
  mutable absl::Mutex mu_;
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace praxis::serve
