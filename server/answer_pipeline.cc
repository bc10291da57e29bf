#include "server/answer_pipeline.h"

#include <utility>

namespace praxis::serve {

AnswerPipeline::AnswerPipeline(std::function<bool()> worth_it)
    : worth_it_(std::move(worth_it)), thread_([this] { Loop(); }) {}

AnswerPipeline::~AnswerPipeline() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

bool AnswerPipeline::Offer(Answer& answer) {
  if (!worth_it_()) return false;
  absl::MutexLock lock(&mu_);
  if (waiting_.has_value() || stop_) return false;
  waiting_.emplace(std::move(answer));
  return true;
}

void AnswerPipeline::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](AnswerPipeline* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
        return !p->waiting_.has_value() && !p->answering_;
      },
      this));
}

void AnswerPipeline::Loop() {
  mu_.Lock();
  while (true) {
    mu_.Await(absl::Condition(
        +[](AnswerPipeline* p)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || p->waiting_.has_value(); },
        this));
    if (!waiting_.has_value()) break;  // stopped, and everything taken has run
    Answer answer = *std::move(waiting_);
    waiting_.reset();
    answering_ = true;
    mu_.Unlock();
    std::move(answer)();
    mu_.Lock();
    answering_ = false;
  }
  mu_.Unlock();
}

}  // namespace praxis::serve
