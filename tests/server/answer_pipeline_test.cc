// The answer pipeline: what it takes, what it leaves to the worker, the order it answers in, and
// that Flush and destruction wait for every answer taken. Also built under ThreadSanitizer.

#include "server/answer_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace praxis::serve {
namespace {

TEST(AnswerPipelineTest, WithNothingElseToRunTheWorkerAnswersItself) {
  AnswerPipeline pipeline([] { return false; });
  bool ran = false;
  AnswerPipeline::Answer answer = [&ran] { ran = true; };
  EXPECT_FALSE(pipeline.Offer(answer));
  ASSERT_TRUE(answer);  // left to the caller, untouched
  std::move(answer)();
  EXPECT_TRUE(ran);
}

TEST(AnswerPipelineTest, ATakenAnswerRunsOnThePipelinesThreadAndFlushWaitsForIt) {
  AnswerPipeline pipeline([] { return true; });
  std::thread::id where;
  AnswerPipeline::Answer answer = [&where] { where = std::this_thread::get_id(); };
  ASSERT_TRUE(pipeline.Offer(answer));
  pipeline.Flush();
  EXPECT_NE(where, std::thread::id());
  EXPECT_NE(where, std::this_thread::get_id());
}

TEST(AnswerPipelineTest, OneBatchWaitsBehindTheOneAnsweredAndAFullPipelineRefuses) {
  AnswerPipeline pipeline([] { return true; });
  absl::Notification started, release;
  absl::Mutex mu;
  std::vector<int> order;
  auto record = [&](int i) {
    absl::MutexLock lock(&mu);
    order.push_back(i);
  };
  AnswerPipeline::Answer first = [&] {
    started.Notify();
    release.WaitForNotification();
    record(1);
  };
  AnswerPipeline::Answer second = [&] { record(2); };
  AnswerPipeline::Answer third = [&] { record(3); };
  ASSERT_TRUE(pipeline.Offer(first));
  started.WaitForNotification();  // the first is being answered
  EXPECT_TRUE(pipeline.Offer(second));
  EXPECT_FALSE(pipeline.Offer(third));  // the second still waits: the worker answers this one
  std::move(third)();
  release.Notify();
  pipeline.Flush();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{3, 1, 2}));
}

TEST(AnswerPipelineTest, DestructionRunsEveryAnswerTaken) {
  std::atomic<int> ran = 0;
  {
    AnswerPipeline pipeline([] { return true; });
    for (int i = 0; i < 100; ++i) {
      AnswerPipeline::Answer answer = [&ran] { ran.fetch_add(1); };
      if (!pipeline.Offer(answer)) std::move(answer)();
    }
  }
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace praxis::serve
