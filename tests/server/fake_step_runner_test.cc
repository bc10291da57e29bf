// The fake stands in for the model in the server's serving tests, so it must look like the model
// from outside: the same output names, shapes, dtypes, spans and counts, and rows answered alone.

#include "tests/server/fake_step_runner.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "model/model_loader.h"
#include "server/step_batch.h"
#include "tests/server/server_steps.h"
#include "wire/synthetic.h"

namespace praxis::serve::fixtures {
namespace {

model::OutputSelection All(const model::StepRunner& r) {
  return model::OutputSelection::All(static_cast<int>(r.config().encoder.tap_blocks.size()));
}

void ExpectSpan(const model::Span& got, const model::Span& want, const char* name) {
  EXPECT_EQ(got.start, want.start) << name;
  EXPECT_EQ(got.length, want.length) << name;
}

TEST(FakeStepRunnerTest, OutputsHaveTheRealModelsNamesShapesDtypesAndSpans) {
  model::BackboneStepRunner real(std::move(model::LoadModel({}, {}).value().model));
  FakeStepRunner fake;
  int seed = 0;
  for (const wire::StepGeometry& l : kLayouts) {
    for (bool decode : {true, false}) {
      model::StepInputs in =
          wire::SyntheticInputs(fake.config().step_dims(), l, /*batch=*/2, ++seed);
      in.decode = decode;
      const model::BackboneOutput want = real.Run(in, All(real)).value();
      const model::BackboneOutput got = fake.Run(in, All(fake)).value();
      const auto want_named = model::NamedOutputs(want);
      const auto got_named = model::NamedOutputs(got);
      ASSERT_EQ(got_named.size(), want_named.size());
      for (size_t i = 0; i < want_named.size(); ++i) {
        EXPECT_EQ(got_named[i].first, want_named[i].first);
        EXPECT_EQ(got_named[i].second.sizes(), want_named[i].second.sizes()) << want_named[i].first;
        EXPECT_EQ(got_named[i].second.scalar_type(), want_named[i].second.scalar_type())
            << want_named[i].first;
      }
      const model::EncoderFeatures &g = got.features, &w = want.features;
      ExpectSpan(g.register_span, w.register_span, "register");
      ExpectSpan(g.anchor_span, w.anchor_span, "anchor");
      ExpectSpan(g.text_span, w.text_span, "text");
      ExpectSpan(g.noised_span, w.noised_span, "noised");
      ASSERT_EQ(g.clean_span.has_value(), w.clean_span.has_value());
      if (w.clean_span) ExpectSpan(*g.clean_span, *w.clean_span, "clean");
      EXPECT_EQ(g.frames_per_chunk, w.frames_per_chunk);
      EXPECT_EQ(g.tokens_per_frame, w.tokens_per_frame);
      EXPECT_EQ(g.n_chunks, w.n_chunks);
    }
  }
  EXPECT_EQ(fake.batches_entered(), 6);
  EXPECT_EQ(fake.rows_run(), 12);
  EXPECT_EQ(fake.mask_cache_stats().misses, 6) << "one per layout key (decode is part of it)";
}

// Like the model, the fake gives only what it is asked for (and remembers what that was).
TEST(FakeStepRunnerTest, OnlyTheWantedOutputsAsTheModel) {
  model::BackboneStepRunner real(std::move(model::LoadModel({}, {}).value().model));
  FakeStepRunner fake;
  const model::StepInputs in =
      wire::SyntheticInputs(fake.config().step_dims(), kLayouts[0], /*batch=*/1, 5);
  const model::OutputSelection wanted{.velocity = true, .taps = {1}, .positions = true};
  const auto want = model::NamedOutputs(real.Run(in, wanted).value());
  const auto got = model::NamedOutputs(fake.Run(in, wanted).value());
  std::vector<std::string> want_names, got_names;
  for (const auto& [name, t] : want) want_names.push_back(name);
  for (const auto& [name, t] : got) got_names.push_back(name);
  EXPECT_EQ(want_names, (std::vector<std::string>{"velocity", "tap.1", "positions"}));
  EXPECT_EQ(got_names, want_names);
  ASSERT_EQ(fake.wanted().size(), 1u);
  EXPECT_TRUE(fake.wanted()[0].velocity);
  EXPECT_FALSE(fake.wanted()[0].cond);
  EXPECT_EQ(fake.wanted()[0].taps, std::vector<int>{1});
}

// A row is answered as it would be alone, and differently from another row: the server's batching
// tests rely on both.
TEST(FakeStepRunnerTest, EachRowIsAnsweredAsItWouldBeAlone) {
  FakeStepRunner fake;
  const model::StepInputs a = wire::SyntheticInputs(fake.config().step_dims(), kLayouts[0], 1, 1);
  const model::StepInputs b = wire::SyntheticInputs(fake.config().step_dims(), kLayouts[0], 1, 2);
  const model::StepInputs* both[] = {&a, &b};
  const model::BackboneOutput batch = fake.Run(StackSteps(both), All(fake)).value();
  const model::BackboneOutput alone = fake.Run(b, All(fake)).value();
  const auto sliced = model::NamedOutputs(SliceRows(batch, 1, 1));
  const auto want = model::NamedOutputs(alone);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::equal(sliced[i].second, want[i].second)) << want[i].first;
  }
  EXPECT_FALSE(torch::equal(batch.cond[0], batch.cond[1]));
  EXPECT_EQ(fake.mask_cache_stats().hits, 1);
}

TEST(FakeStepRunnerTest, GateFailuresAndDelayAreInjected) {
  FakeStepRunner fake;
  const model::StepInputs in = wire::SyntheticInputs(fake.config().step_dims(), kLayouts[1], 1, 3);
  fake.Close();
  absl::StatusOr<model::BackboneOutput> held = absl::UnknownError("not run");
  std::thread t([&] { held = fake.Run(in, All(fake)); });
  ASSERT_TRUE(fake.WaitEntered(1));
  EXPECT_EQ(fake.rows_run(), 0) << "held at the gate";
  fake.Open();
  t.join();
  EXPECT_TRUE(held.ok()) << held.status();

  fake.ThrowNext();
  EXPECT_THROW((void)fake.Run(in, All(fake)), std::runtime_error);
  fake.FailNext(absl::InternalError("injected"));
  EXPECT_EQ(fake.Run(in, All(fake)).status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(fake.Run(in, All(fake)).ok()) << "only the next batch fails";

  fake.SetDelay(absl::Milliseconds(30));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(fake.Run(in, All(fake)).ok());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
  EXPECT_EQ(fake.batches_entered(), 5);
}

TEST(FakeStepRunnerTest, RefusesInputsTheModelWould) {
  FakeStepRunner fake;
  model::StepInputs in = wire::SyntheticInputs(fake.config().step_dims(), kLayouts[0], 1, 4);
  in.frames_per_chunk = 0;
  EXPECT_EQ(fake.Run(in, All(fake)).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace praxis::serve::fixtures
