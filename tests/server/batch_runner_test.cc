// Only what is asked for: a batch's runner gets the outputs its callers asked for together, and
// each caller gets exactly its own outputs and rows, as views of the batch where every caller
// asked for the output and as copies where not (server/step_batch.h TaskRows).

#include "server/batch_runner.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "model/config.h"
#include "server/step_batch.h"
#include "server/step_request.h"
#include "server/step_task.h"
#include "tests/server/fake_step_runner.h"
#include "tests/server/malformed_requests.h"

namespace praxis::serve {
namespace {

using model::OutputSelection;

void ExpectSame(const OutputSelection& got, const OutputSelection& want) {
  EXPECT_EQ(got.velocity, want.velocity);
  EXPECT_EQ(got.cond, want.cond);
  EXPECT_EQ(got.taps, want.taps);
  EXPECT_EQ(got.embeddings, want.embeddings);
  EXPECT_EQ(got.positions, want.positions);
}

TEST(OutputSelectionTest, AnyAndAllOfABatchsSelections) {
  const OutputSelection a{.velocity = true, .taps = {2, 0}};
  const OutputSelection b{.cond = true, .taps = {0, 1}, .positions = true};
  const OutputSelection c{.velocity = true, .cond = true, .taps = {0}, .positions = true};
  ExpectSame(model::WantedByAny({&a, &b, &c}), {true, true, {0, 1, 2}, false, true});
  ExpectSame(model::WantedByAll({&a, &b, &c}), {false, false, {0}, false, false});
  ExpectSame(model::WantedByAll({&b, &c}), {false, true, {0}, false, true});
  ExpectSame(model::WantedByAny({&a}), {true, false, {0, 2}, false, false});
  ExpectSame(model::WantedByAll({&a}), {true, false, {0, 2}, false, false});
  ExpectSame(model::WantedByAny({}), {});
}

// A task of the valid tiny request (B = 1) asking for `outputs`; its answer lands in `answer`.
std::unique_ptr<StepTask> Task(const model::BackboneConfig& config, int seed,
                               const v1::OutputSelection& outputs,
                               absl::StatusOr<StepResult>* answer) {
  v1::StepRequest r = fixtures::Valid();
  *r.mutable_noised() = fixtures::Wire(torch::randn({1, 16, 2, 3, 4}) + seed);
  *r.mutable_outputs() = outputs;
  return std::make_unique<StepTask>(*DecodeStepRequest(r, config), absl::InfiniteFuture(),
                                    std::make_shared<std::atomic<bool>>(false),
                                    [answer](absl::StatusOr<StepResult> s) { *answer = s; });
}

TEST(RunStepBatchTest, TheRunnerGetsTheUnionAndEachTaskItsOwnOutputs) {
  fixtures::FakeStepRunner fake;
  ServerMetrics metrics({}, [] { return LiveValues{}; });
  v1::OutputSelection first, second;
  first.set_velocity(true);
  first.set_cond(true);
  first.add_taps(1);
  second.set_cond(true);
  second.set_positions(true);
  absl::StatusOr<StepResult> a = absl::UnknownError(""), b = absl::UnknownError("");
  std::vector<std::unique_ptr<batching::Task>> batch;
  batch.push_back(Task(fake.config(), 1, first, &a));
  batch.push_back(Task(fake.config(), 2, second, &b));
  const model::StepInputs in0 = static_cast<StepTask&>(*batch[0]).inputs();
  const model::StepInputs in1 = static_cast<StepTask&>(*batch[1]).inputs();
  RunStepBatch(fake, metrics, std::move(batch));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();

  ASSERT_EQ(fake.wanted().size(), 1u);
  ExpectSame(fake.wanted()[0], {true, true, {1}, false, true});
  const model::BackboneOutput &ga = a->output, &gb = b->output;
  EXPECT_TRUE(ga.velocity.defined() && ga.cond.defined() && ga.features.taps[1].defined());
  EXPECT_FALSE(ga.features.taps[0].defined() || ga.features.positions.defined());
  EXPECT_TRUE(gb.cond.defined() && gb.features.positions.defined());
  EXPECT_FALSE(gb.velocity.defined() || gb.features.taps[1].defined());
  EXPECT_FALSE(ga.features.embeddings.defined() || gb.features.embeddings.defined());

  // Bit for bit what each row alone would get.
  using fixtures::FakeStepRunner;
  const model::BackboneOutput alone0 = FakeStepRunner::Outputs(fake.config(), in0, torch::kFloat32);
  const model::BackboneOutput alone1 = FakeStepRunner::Outputs(fake.config(), in1, torch::kFloat32);
  EXPECT_TRUE(torch::equal(ga.velocity, alone0.velocity));
  EXPECT_TRUE(torch::equal(ga.cond, alone0.cond));
  EXPECT_TRUE(torch::equal(ga.features.taps[1], alone0.features.taps[1]));
  EXPECT_TRUE(torch::equal(gb.cond, alone1.cond));
  EXPECT_TRUE(torch::equal(gb.features.positions, alone1.features.positions));

  // cond, which both asked for, is a view of the batch; the others own just their rows.
  EXPECT_EQ(ga.cond.storage().nbytes(), 2 * ga.cond.nbytes());
  EXPECT_EQ(ga.velocity.storage().nbytes(), ga.velocity.nbytes());
  EXPECT_EQ(ga.features.taps[1].storage().nbytes(), ga.features.taps[1].nbytes());
  EXPECT_EQ(gb.features.positions.storage().nbytes(), gb.features.positions.nbytes());
}

}  // namespace
}  // namespace praxis::serve
