// CUDA graphs of the forward (issue 14): a capture in cudaStreamCaptureModeGlobal succeeding is
// the proof that the forward never synchronises with the host; a replay equals the eager forward
// bit for bit, also after its static inputs are refilled; the cache stays within its bytes; a
// forward that cannot be captured runs eagerly. Skipped without a CUDA device.

#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include <string>

#include "model/step_graphs.h"
#include "tests/gpu/gpu_compare.h"
#include "wire/synthetic.h"

namespace praxis::model::gpu {
namespace {

struct Case {
  std::string config;  // empty: the embedded tiny model
  WindowLayout layout;
  int64_t rows;
};

std::vector<Case> Cases() {
  return {{"", kTinyLayout, 1}, {"", kTinyLayout, 4}, {RepoConfig("bench.json"), kMedium, 2}};
}

std::string Name(const Case& c) {
  return CaseName(c.config, c.layout) + " x" + std::to_string(c.rows);
}

StepInputs Inputs(const VideoBackbone& model, const Case& c, uint64_t seed) {
  return wire::SyntheticInputs(model.config().step_dims(), GeometryOf(c.layout), c.rows, seed);
}

// Every output's bytes on the host, by name: equal bytes are equal bits (NaN, -0 included).
std::vector<std::pair<std::string, torch::Tensor>> Host(const BackboneOutput& out) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (auto& [name, t] : NamedOutputs(out)) {
    named.emplace_back(name, t.cpu().contiguous().view({-1}).view(torch::kUInt8));
  }
  return named;
}

// The device bytes the caching allocator still reserves once it and cuBLAS freed what they cache:
// cuBLAS keeps a workspace per stream it ran on (32 MiB and more on Hopper), which the graphs'
// capture stream adds once and which is no leak of theirs.
int64_t UnusedFreedReservedBytes() {
  at::cuda::clearCublasWorkspaces();
  c10::cuda::CUDACachingAllocator::emptyCache();
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
      .reserved_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .current;
}

void ExpectBitEqual(const BackboneOutput& got, const BackboneOutput& want,
                    const std::string& what) {
  const auto g = Host(got), w = Host(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].first, w[i].first) << what;
    EXPECT_TRUE(torch::equal(g[i].second, w[i].second)) << what << " " << g[i].first;
  }
}

TEST(GpuGraphTest, Bf16ForwardCapturesWithoutSyncAndReplaysBitEqualToEager) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  for (const Case& c : Cases()) {
    auto model = Load(c.config, "cuda", "bfloat16");
    ASSERT_TRUE(model);
    StepGraphs graphs(*model, int64_t{16} << 30);
    const StepInputs first = Inputs(*model, c, 1);
    // Global capture mode: any host synchronisation in the forward fails the capture.
    const absl::Status captured = graphs.Capture(first);
    ASSERT_TRUE(captured.ok()) << Name(c) << ": " << captured;
    for (uint64_t seed : {1, 2, 3}) {  // the static inputs refilled with other values each time
      const StepInputs in = Inputs(*model, c, seed);
      absl::StatusOr<BackboneOutput> replayed = graphs.Run(in);
      ASSERT_TRUE(replayed.ok()) << replayed.status();
      // The replay's outputs hold until the next replay; the eager forward allocates elsewhere.
      absl::StatusOr<BackboneOutput> eager = model->ForwardValidated(in);
      ASSERT_TRUE(eager.ok()) << eager.status();
      ExpectBitEqual(*replayed, *eager, Name(c) + " seed " + std::to_string(seed));
    }
    const GraphStats s = graphs.stats();
    EXPECT_EQ(s.cache.misses, 1) << Name(c);
    EXPECT_EQ(s.cache.hits, 3) << Name(c);
    EXPECT_EQ(s.capture_failures, 0) << Name(c);
    EXPECT_GT(s.cache.bytes, 0) << Name(c);
  }
}

// The bytes each of `rows` holds once captured, measured in a cache that keeps them all.
std::vector<int64_t> GraphBytes(VideoBackbone& model, const std::vector<int64_t>& rows) {
  StepGraphs probe(model, int64_t{16} << 30);
  std::vector<int64_t> bytes;
  for (int64_t r : rows) {
    const int64_t before = probe.stats().cache.bytes;
    EXPECT_TRUE(probe.Capture(Inputs(model, {"", kTinyLayout, r}, 1)).ok());
    bytes.push_back(probe.stats().cache.bytes - before);
  }
  return bytes;
}

TEST(GpuGraphTest, CacheStaysWithinItsBytesByEvictingTheLeastRecentlyUsed) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  auto model = Load("", "cuda", "bfloat16");
  ASSERT_TRUE(model);
  const std::vector<int64_t> rows = {1, 2, 3};
  const std::vector<int64_t> bytes = GraphBytes(*model, rows);
  // Room for each graph, not for all three: the oldest goes.
  const int64_t bound = bytes[0] + bytes[1] + bytes[2] - 1;
  StepGraphs graphs(*model, bound);
  for (int64_t r : rows) {
    ASSERT_TRUE(graphs.Capture(Inputs(*model, {"", kTinyLayout, r}, 1)).ok()) << r << " rows";
  }
  const GraphStats s = graphs.stats();
  EXPECT_LE(s.cache.bytes, bound);
  EXPECT_GE(s.cache.evictions, 1);
  EXPECT_EQ(s.cache.entries, 3 - s.cache.evictions);
  EXPECT_EQ(s.over_budget, 0);
  // The evicted 1-row graph is captured again and still replays correctly.
  const StepInputs in = Inputs(*model, {"", kTinyLayout, 1}, 7);
  absl::StatusOr<BackboneOutput> replayed = graphs.Run(in);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  ExpectBitEqual(*replayed, *model->ForwardValidated(in), "after eviction");
  EXPECT_EQ(graphs.stats().cache.misses, 4);
}

TEST(GpuGraphTest, AGraphOverTheBoundAloneRunsEagerlyAndEvictsNothing) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  auto model = Load("", "cuda", "bfloat16");
  ASSERT_TRUE(model);
  const std::vector<int64_t> bytes = GraphBytes(*model, {1, 4});
  ASSERT_LT(bytes[0], bytes[1]);
  // Room for the 1-row graph, not for the 4-row one alone.
  StepGraphs graphs(*model, bytes[1] - 1);
  ASSERT_TRUE(graphs.Capture(Inputs(*model, {"", kTinyLayout, 1}, 1)).ok());
  const absl::Status big = graphs.Capture(Inputs(*model, {"", kTinyLayout, 4}, 1));
  EXPECT_FALSE(big.ok());
  EXPECT_NE(std::string(big.message()).find("--cuda_graph_bytes"), std::string::npos) << big;
  for (uint64_t seed : {2, 3}) {  // eager, and not captured again
    const StepInputs in = Inputs(*model, {"", kTinyLayout, 4}, seed);
    absl::StatusOr<BackboneOutput> out = graphs.Run(in);
    ASSERT_TRUE(out.ok()) << out.status();
    ExpectBitEqual(*out, *model->ForwardValidated(in), "over the bound, eager");
  }
  const GraphStats s = graphs.stats();
  EXPECT_EQ(s.over_budget, 1);
  EXPECT_EQ(s.capture_failures, 0);
  EXPECT_EQ(s.cache.misses, 2);
  EXPECT_EQ(s.cache.evictions, 0) << "the 1-row graph stays";
  EXPECT_EQ(s.cache.entries, 2);
  EXPECT_LE(s.cache.bytes, bytes[1] - 1);
}

TEST(GpuGraphTest, ForwardThatSynchronisesFallsBackToEagerOnce) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  // float32 MoE on CUDA takes the per-expert loop, which reads its token counts on the host
  // (model/layers.cc): its capture must fail for that reason, cleanly, and the layout run eagerly.
  auto model = Load("", "cuda", "float32");
  ASSERT_TRUE(model);
  const StepInputs in = Inputs(*model, {"", kTinyLayout, 2}, 1);
  ASSERT_TRUE(model->ForwardValidated(in).ok());  // masks and lazy state exist before measuring
  const int64_t reserved = UnusedFreedReservedBytes();
  {
    StepGraphs graphs(*model, int64_t{16} << 30);
    const absl::Status captured = graphs.Capture(in);
    EXPECT_FALSE(captured.ok());
    // "... when stream is capturing" (CUDA) or "... during CUDA graph capture ..." (PyTorch).
    EXPECT_NE(std::string(captured.message()).find("captur"), std::string::npos) << captured;
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<BackboneOutput> out = graphs.Run(in);
      ASSERT_TRUE(out.ok()) << out.status();
      ExpectBitEqual(*out, *model->ForwardValidated(in), "eager fallback");
    }
    const GraphStats s = graphs.stats();
    EXPECT_EQ(s.capture_failures, 1);
    EXPECT_EQ(s.cache.bytes, 0) << "a failed capture holds no buffers";
  }
  // The abandoned capture's pool was released: with the graphs (and the plan the failed entry
  // kept) gone, nothing stays reserved beyond what was before.
  EXPECT_LE(UnusedFreedReservedBytes(), reserved);
}

}  // namespace
}  // namespace praxis::model::gpu
