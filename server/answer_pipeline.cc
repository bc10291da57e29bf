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
  if (!waiting_.empty() || stop_) return false;
  waiting_.push_back(std::move(answer));
  return true;
}

void AnswerPipeline::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](AnswerPipeline* p)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->waiting_.empty() && !p->answering_; },
      this));
}

void AnswerPipeline::Loop() {
  mu_.Lock();
  while (true) {
    mu_.Await(absl::Condition(
        +[](AnswerPipeline* p)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || !p->waiting_.empty(); },
        this));
    if (waiting_.empty()) break;  // stopped, and everything taken has run
    Answer answer = std::move(waiting_.front());
    waiting_.pop_front();
    answering_ = true;
    mu_.Unlock();
    std::move(answer)();
    mu_.Lock();
    answering_ = false;
  }
  mu_.Unlock();
}

}  // namespace praxis::serve
