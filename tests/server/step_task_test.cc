#include "server/step_task.h"

#include <gtest/gtest.h>

#include <memory>

#include "model/config.h"
#include "server/step_request.h"
#include "tests/server/malformed_requests.h"

namespace praxis::serve {
namespace {

std::unique_ptr<StepTask> Task(StepTask::Done done) {
  const model::BackboneConfig c =
      *model::LoadConfig(std::string(PRAXIS_SOURCE_DIR) + "/configs/tiny.json");
  return std::make_unique<StepTask>(*DecodeStepRequest(fixtures::Valid(), c),
                                    absl::InfiniteFuture(),
                                    std::make_shared<std::atomic<bool>>(false), std::move(done));
}

TEST(StepTaskTest, CarriesTheCostAndLayoutOfItsStep) {
  int answers = 0;
  auto t = Task([&](absl::StatusOr<StepResult>) { ++answers; });
  EXPECT_GT(t->cost(), 0);
  EXPECT_EQ(t->rows(), 1);
  EXPECT_FALSE(t->layout_key().empty());
  t->Fail(absl::CancelledError("x"));
  EXPECT_EQ(answers, 1);
}

// A broken invariant crashes loudly (PRAXIS_CHECK), naming itself.
TEST(StepTaskDeathTest, AnsweredTwiceOrNeverAborts) {
  EXPECT_DEATH(
      {
        auto t = Task([](absl::StatusOr<StepResult>) {});
        t->Fail(absl::CancelledError("once"));
        t->Fail(absl::CancelledError("twice"));
      },
      "check failed: done_: StepTask answered twice");
  EXPECT_DEATH({ Task([](absl::StatusOr<StepResult>) {}).reset(); },
               "StepTask destroyed without an answer");
}

}  // namespace
}  // namespace praxis::serve
