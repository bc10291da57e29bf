// Mask benchmarks on the bench layout (registers 4, anchor 30x40, text 256, K = 4, F = 2,
// h x w = 30 x 40, block 128): cold BlockMask build vs MaskCache hit, and the mask's size and
// sparsity as counters.

#include <benchmark/benchmark.h>

#include "model/mask_cache.h"
#include "model/masks.h"

namespace praxis::model {
namespace {

void SetMaskCounters(benchmark::State& state, const BlockMask& m) {
  const torch::Tensor classes = m.TileClasses();
  const double tiles = static_cast<double>(classes.numel());
  state.counters["tokens"] = static_cast<double>(m.q_len);
  state.counters["blockmask_bytes"] = static_cast<double>(m.nbytes());
  state.counters["dense_bytes"] = static_cast<double>(m.q_len) * static_cast<double>(m.kv_len);
  state.counters["empty_tile_fraction"] = (classes == 0).sum().item<double>() / tiles;
  state.counters["full_tile_fraction"] = (classes == 2).sum().item<double>() / tiles;
}

void BM_EncoderMaskColdBuild(benchmark::State& state) {
  const MaskKey key = EncoderMaskKey(kBenchLayout, 128);
  for (auto _ : state) {
    MaskCache cache;  // a fresh cache: every lookup is a miss that builds
    benchmark::DoNotOptimize(cache.GetTower(key));
  }
  SetMaskCounters(state, (*MaskCache().GetTower(key))->block);
}
BENCHMARK(BM_EncoderMaskColdBuild)->Unit(benchmark::kMicrosecond);

void BM_EncoderMaskCacheHit(benchmark::State& state) {
  const MaskKey key = EncoderMaskKey(kBenchLayout, 128);
  MaskCache cache;
  (void)cache.GetTower(key);
  for (auto _ : state) benchmark::DoNotOptimize(cache.GetTower(key));
}
BENCHMARK(BM_EncoderMaskCacheHit)->Unit(benchmark::kMicrosecond);

// The dense mask of the same layout, the form a dense-SDPA server would hold per layout.
void BM_EncoderDenseMask(benchmark::State& state) {
  const MaskKey key = EncoderMaskKey(kBenchLayout, 128);
  const TokenTags tags = *WindowTags(key.slots, key.chunk_size);
  const MaskRule rule = ChunkCausalRule(tags);
  for (auto _ : state) benchmark::DoNotOptimize(DenseMask(rule, tags.length(), tags.length()));
}
BENCHMARK(BM_EncoderDenseMask)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace praxis::model

BENCHMARK_MAIN();
