// The text cache: a row's projection is computed once per distinct text (bytes, shape and dtype),
// bounded by entries and bytes, and a model with it computes what a model without it does.

#include "model/text_cache.h"

#include <gtest/gtest.h>

#include "model/backbone.h"
#include "model/config.h"
#include "model/model_loader.h"
#include "model/random_weights.h"
#include "wire/synthetic.h"

namespace praxis::model {
namespace {

// A stand-in projection that counts its rows: each row's tokens are its text's first 4 columns
// doubled, so that a wrong row in the output is seen.
struct CountingProjection {
  int64_t rows = 0;
  torch::Tensor operator()(const torch::Tensor& text) {
    rows += text.size(0);
    return text.narrow(2, 0, 4) * 2;
  }
};

torch::Tensor Texts(int64_t rows, uint64_t seed) {
  return torch::randn({rows, 3, 8}, torch::Generator(at::detail::createCPUGenerator(seed)));
}

TEST(TextCacheTest, ProjectsEachDistinctTextOnceAndAnswersEveryRow) {
  TextCache cache(/*max_entries=*/8, /*max_bytes=*/int64_t{1} << 20);
  CountingProjection project;
  const torch::Tensor a = Texts(1, 1), b = Texts(1, 2);
  const torch::Tensor text = torch::cat({a, b, a, a}, 0);  // one batch, a text shared by 3 rows
  const torch::Tensor out = cache.Tokens(text, std::ref(project));
  EXPECT_TRUE(torch::equal(out, text.narrow(2, 0, 4) * 2));
  EXPECT_EQ(project.rows, 2);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.entries, 2);

  // The next step's rows, in another order: nothing projected again.
  const torch::Tensor next = torch::cat({b, a}, 0);
  EXPECT_TRUE(torch::equal(cache.Tokens(next, std::ref(project)), next.narrow(2, 0, 4) * 2));
  EXPECT_EQ(project.rows, 2);
  EXPECT_EQ(cache.stats().hits, 4);
}

TEST(TextCacheTest, SameBytesInAnotherDtypeOrShapeAreAnotherText) {
  TextCache cache(8, int64_t{1} << 20);
  CountingProjection project;
  const torch::Tensor a = Texts(1, 1);                  // [1, 3, 8] float32
  const torch::Tensor as_int = a.view(torch::kInt32);   // the same bytes as int32
  const torch::Tensor reshaped = a.reshape({1, 6, 4});  // the same bytes, [1, 6, 4]
  cache.Tokens(a, std::ref(project));
  cache.Tokens(as_int, std::ref(project));
  cache.Tokens(reshaped, std::ref(project));
  EXPECT_EQ(project.rows, 3);
  EXPECT_EQ(cache.stats().hits, 0);
}

TEST(TextCacheTest, StaysWithinItsEntriesAndBytes) {
  const torch::Tensor one = Texts(1, 0);
  const int64_t entry_bytes = one.nbytes() + (one.narrow(2, 0, 4) * 2).nbytes();
  TextCache by_entries(/*max_entries=*/3, int64_t{1} << 20);
  TextCache by_bytes(/*max_entries=*/64, /*max_bytes=*/2 * entry_bytes);
  CountingProjection project;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    by_entries.Tokens(Texts(1, seed), std::ref(project));
    by_bytes.Tokens(Texts(1, seed), std::ref(project));
  }
  EXPECT_EQ(by_entries.stats().entries, 3);
  EXPECT_EQ(by_entries.stats().evictions, 7);
  EXPECT_EQ(by_bytes.stats().entries, 2);
  EXPECT_LE(by_bytes.stats().bytes, 2 * entry_bytes);
}

TEST(TextCacheTest, AFailedProjectionThrowsAndIsNotCached) {
  TextCache cache(8, int64_t{1} << 20);
  const torch::Tensor a = Texts(1, 1);
  EXPECT_THROW(cache.Tokens(a,
                            [](const torch::Tensor&) -> torch::Tensor {
                              throw std::runtime_error("projection failed");
                            }),
               std::runtime_error);
  CountingProjection project;
  cache.Tokens(a, std::ref(project));
  EXPECT_EQ(project.rows, 1);
  EXPECT_EQ(cache.stats().entries, 1);
}

double MaxDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// The embedded tiny model with random weights, with or without a text cache.
std::unique_ptr<VideoBackbone> Tiny(int64_t text_cache_entries) {
  absl::StatusOr<BackboneConfig> config = ParseConfig(kEmbeddedTinyConfig);
  EXPECT_TRUE(config.ok()) << config.status();
  auto model = VideoBackbone::Create(*config, RandomWeights(*config, /*seed=*/3),
                                     {.text_cache_entries = text_cache_entries});
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

TEST(TextCacheTest, AModelWithTheCacheComputesWhatOneWithoutDoes) {
  std::unique_ptr<VideoBackbone> plain = Tiny(0), cached = Tiny(16);
  const BackboneConfig& c = plain->config();
  const wire::StepGeometry g{
      .text_len = 5, .anchor_h = 4, .anchor_w = 4, .k = 2, .f = 1, .h = 4, .w = 4};
  StepInputs in = wire::SyntheticInputs(c.step_dims(), g, /*rows=*/3, /*seed=*/7);
  in.text[2] = in.text[0];  // two rows with one instruction
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<BackboneOutput> want = plain->Forward(in);
    absl::StatusOr<BackboneOutput> got = cached->Forward(in);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    // Equal up to float32 rounding: a row projected alone may round apart from a batch's GEMM.
    EXPECT_LT(MaxDiff(got->velocity, want->velocity), 1e-5) << "step " << step;
    EXPECT_LT(MaxDiff(got->features.embeddings, want->features.embeddings), 1e-5);
    in.noised = in.noised * 0.5;  // the next denoising step: same text, other video
  }
  const CacheStats s = cached->text_cache_stats();
  EXPECT_EQ(s.misses, 2);  // two distinct texts
  EXPECT_EQ(s.hits, 4);    // the shared row, then all three rows of the second step
  EXPECT_EQ(plain->text_cache_stats().misses, 0);
}

}  // namespace
}  // namespace praxis::model
