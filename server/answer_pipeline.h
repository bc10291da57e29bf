#pragma once

#include <functional>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace praxis::serve {

// Answers computed batches on a thread of its own, so that the batcher's worker starts the next
// batch while the last one's answers are built and their first writes started (the rest of each
// answer is written from gRPC's threads, as before).
//
// The worker offers each batch's answers; the pipeline takes them only when `worth_it()` says
// another batch waits to run (with nothing waiting, a hand-off would only add a thread wake-up to
// the answer's latency) and no other offered batch still waits behind the one being answered (so
// answers never pile up: a full pipeline leaves the worker to answer itself). Offered answers run
// in the order they were taken. Thread-safe; `worth_it` is called on the offering thread.
class AnswerPipeline {
 public:
  using Answer = absl::AnyInvocable<void() &&>;

  explicit AnswerPipeline(std::function<bool()> worth_it);
  // Runs every answer taken, then stops the thread.
  ~AnswerPipeline();
  AnswerPipeline(const AnswerPipeline&) = delete;
  AnswerPipeline& operator=(const AnswerPipeline&) = delete;

  // Takes `answer` to run on the pipeline's thread (true), or leaves it for the caller to run
  // (false, `answer` untouched).
  bool Offer(Answer& answer);
  // Returns once every answer taken before the call has run.
  void Flush();

 private:
  void Loop();

  const std::function<bool()> worth_it_;
  absl::Mutex mu_;
  std::optional<Answer> waiting_ ABSL_GUARDED_BY(mu_);  // taken, not yet begun
  bool answering_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace praxis::serve
