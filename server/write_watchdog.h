#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace praxis::serve {

// Cancels a call whose current write has not completed within a timeout (--write_timeout): a
// reader that grants no HTTP/2 flow-control window would otherwise pin its computed answer
// forever. One thread scans the watched calls a few times per timeout. Thread-safe.
class WriteWatchdog {
 public:
  // One call's write clock, shared by its reactor and the watchdog. The reactor reports each write
  // it starts and finishes, and CallDone in OnDone before the context goes away. Thread-safe; the
  // reactor must not hold a lock of its own while calling it (TryCancel may run the reactor's
  // reactions inline on the watchdog's thread).
  class Clock {
   public:
    explicit Clock(grpc::ServerContextBase* ctx) : ctx_(ctx) {}
    void WriteStarted();
    void WriteDone();
    void CallDone();

   private:
    friend class WriteWatchdog;
    // Recursive: a reaction run inline by TryCancel on the watchdog's thread re-enters it.
    std::recursive_mutex mu_;
    grpc::ServerContextBase* ctx_;               // null once the call is done
    absl::Time since_ = absl::InfiniteFuture();  // start of the write in flight
  };

  // absl::InfiniteDuration() watches nothing and starts no thread.
  explicit WriteWatchdog(absl::Duration timeout);
  ~WriteWatchdog();
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  // Starts watching the call of `ctx`.
  std::shared_ptr<Clock> Watch(grpc::ServerContextBase* ctx);
  // Calls cancelled for a stalled reader so far.
  int64_t cancelled() const;

 private:
  void Loop();
  // Cancels `c`'s call if its write has stalled; false once the call is done (stop watching it).
  bool Check(Clock& c, absl::Time now);

  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Clock>> clocks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace praxis::serve
