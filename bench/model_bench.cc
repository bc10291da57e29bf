// Backbone benchmarks on configs/bench.json and the bench layout (registers 4, anchor 30x40,
// text 256, K = 4, F = 2, h x w = 30 x 40), bf16 weights, in one run:
//  (a) the block-sparse attention executor vs dense-mask SDPA on the encoder's chunk-causal layout;
//  (b) a whole step's achieved GFLOP/s (useful FLOPs counted) vs LibTorch's bf16 matmul GFLOP/s,
//      also measured in turns (BM_StepBesideMatmul) where the matrix units' rate moves;
//  (c) the peak resident memory of a step;
//  (d) one MoE block in bf16 and float32, its CPU dispatch against the grouped one that CUDA runs,
//      its useful GFLOP/s against LibTorch's matmul in the same dtype;
//  (e) one attention call at the small layout (32,6,8,2,1), 1 or 8 rows, bf16 and float32.
// Run: build/bench/model_bench (PRAXIS_SOURCE_DIR is compiled in to find configs/).

#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "bench/small_layout.h"
#include "bench/stats.h"
#include "model/backbone.h"
#include "model/cpu_kernels.h"
#include "model/layers.h"
#include "model/random_weights.h"
#include "model/step_cost.h"

namespace praxis::model {
namespace {

BackboneConfig BenchConfig() {
  auto c = LoadConfig(std::string(PRAXIS_SOURCE_DIR) + "/configs/bench.json");
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    std::abort();
  }
  return *c;
}

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

StepInputs BenchStep(const BackboneConfig& c) {
  torch::manual_seed(0);
  const auto bf = torch::TensorOptions().dtype(torch::kBFloat16);
  const int64_t C = c.latent_channels(), kf = kBenchLayout.k * kBenchLayout.f;
  StepInputs in;
  in.text = torch::randn({1, kBenchLayout.text_len, c.text_dim}, bf);
  in.anchor = torch::randn({1, C, 1, kBenchLayout.anchor_h, kBenchLayout.anchor_w}, bf);
  in.clean = torch::randn({1, C, kf - kBenchLayout.f, kBenchLayout.h, kBenchLayout.w}, bf);
  in.noised = torch::randn({1, C, kf, kBenchLayout.h, kBenchLayout.w}, bf);
  in.timesteps = torch::rand({1, kBenchLayout.k});
  in.frames_per_chunk = kBenchLayout.f;
  return in;
}

// Registered first, so that its peak RSS is not inflated by the dense attention below.
void BM_Step(benchmark::State& state) {
  torch::set_num_threads(2);
  const BackboneConfig c = BenchConfig();
  auto model = *VideoBackbone::Create(c, RandomWeights(c, 0), {});
  const StepInputs in = BenchStep(c);
  const double rss_before = PeakRssMiB();
  if (!model->Forward(in).ok()) state.SkipWithError("forward failed");  // warm: builds masks
  for (auto _ : state) benchmark::DoNotOptimize(model->Forward(in));
  const double flops = ComputeStepCost(c, kBenchLayout, /*decode=*/true, 1).flops;
  state.counters["useful_GFLOP"] = flops / 1e9;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_rss_MiB"] = PeakRssMiB();
  state.counters["rss_growth_MiB"] = PeakRssMiB() - rss_before;
}
BENCHMARK(BM_Step)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

// LibTorch's GEMM rate on [2048, 2048] operands: arg 0 bf16, 1 float32 (what BM_Step and BM_Moe
// are held against, in the same run).
void BM_Matmul(benchmark::State& state) {
  torch::set_num_threads(2);
  const int64_t n = 2048;
  const auto opts =
      torch::TensorOptions().dtype(state.range(0) == 0 ? torch::kBFloat16 : torch::kFloat32);
  const torch::Tensor a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
  for (auto _ : state) benchmark::DoNotOptimize(torch::matmul(a, b));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * n * n * n / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();

// LibTorch's mean bf16 GEMM rate (GFLOP/s) on [2048, 2048] operands over at least `seconds`.
double Bf16MatmulRate(const torch::Tensor& a, const torch::Tensor& b, double seconds) {
  const double flops = 2.0 * static_cast<double>(a.size(0)) * a.size(1) * b.size(1);
  const auto start = std::chrono::steady_clock::now();
  int64_t calls = 0;
  double elapsed = 0;
  do {
    benchmark::DoNotOptimize(torch::matmul(a, b));
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (elapsed < seconds);
  return flops * static_cast<double>(calls) / elapsed / 1e9;
}

// P6 on a host whose matrix units are shared: BM_Step's step and BM_Matmul's bf16 GEMM measured
// in turns, each step between two 0.3 s GEMM windows, and P6 (step GFLOP/s over the GEMM's) taken
// per step against the windows around it. BM_Step and BM_Matmul, minutes or seconds apart, read
// P6 from 38 to 117 % on a Xeon whose AMX rate moved 2.6x within minutes (docs/benchmarks.md, stop
// 38). Counters: P6 (median over the iterations), P6_min and P6_max, and the medians of both rates.
void BM_StepBesideMatmul(benchmark::State& state) {
  torch::set_num_threads(2);
  const BackboneConfig c = BenchConfig();
  auto model = *VideoBackbone::Create(c, RandomWeights(c, 0), {});
  const StepInputs in = BenchStep(c);
  const auto bf = torch::TensorOptions().dtype(torch::kBFloat16);
  const torch::Tensor a = torch::randn({2048, 2048}, bf), b = torch::randn({2048, 2048}, bf);
  if (!model->Forward(in).ok()) state.SkipWithError("forward failed");  // warm: builds masks
  const double flops = ComputeStepCost(c, kBenchLayout, /*decode=*/true, 1).flops;
  std::vector<double> p6, step_rates, gemm_rates;
  double before = Bf16MatmulRate(a, b, 0.3);
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(model->Forward(in));
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(s);
    const double after = Bf16MatmulRate(a, b, 0.3);
    step_rates.push_back(flops / s / 1e9);
    gemm_rates.push_back((before + after) / 2);
    p6.push_back(step_rates.back() / gemm_rates.back());
    before = after;
  }
  state.counters["P6"] = bench::Median(p6);
  state.counters["P6_min"] = p6.empty() ? 0.0 : *std::min_element(p6.begin(), p6.end());
  state.counters["P6_max"] = p6.empty() ? 0.0 : *std::max_element(p6.begin(), p6.end());
  state.counters["step_GFLOP/s"] = bench::Median(step_rates);
  state.counters["bf16_GEMM_GFLOP/s"] = bench::Median(gemm_rates);
}
BENCHMARK(BM_StepBesideMatmul)->Unit(benchmark::kMillisecond)->Iterations(5)->UseManualTime();

// One MoE block of configs/bench.json (top-k of its experts) on 3104 tokens (the decoder's of a
// bench small step of 8 rows): args {dispatch: 0 the CPU's (pieces of each expert on the threads),
// 1 the grouped one CUDA runs (on the CPU a per-group loop of its own); dtype: 0 bf16, 1 float32}.
// Its useful GFLOP/s (the experts' matmuls) is held against BM_Matmul's in the same dtype.
void BM_Moe(benchmark::State& state) {
  torch::set_num_threads(2);
  const BackboneConfig c = BenchConfig();
  const MoeConfig& m = c.moe;
  const auto dt =
      torch::TensorOptions().dtype(state.range(1) == 0 ? torch::kBFloat16 : torch::kFloat32);
  torch::manual_seed(2);
  const MoeWeights w{.router = torch::randn({m.num_experts, c.dim}, dt),
                     .expert_bias = torch::zeros({m.num_experts}),
                     .gate_up = torch::randn({m.num_experts, c.dim, 2 * m.expert_dim}, dt) / 16,
                     .down = torch::randn({m.num_experts, m.expert_dim, c.dim}, dt) / 16,
                     .shared_gate_up = torch::randn({c.dim, 2 * m.shared_dim}, dt) / 16,
                     .shared_down = torch::randn({m.shared_dim, c.dim}, dt) / 16};
  const int64_t tokens = 3104;
  const torch::Tensor x = torch::randn({1, tokens, c.dim}, dt);
  const MoeDispatch dispatch = state.range(0) == 0 ? MoeDispatch::kAuto : MoeDispatch::kGrouped;
  for (auto _ : state) benchmark::DoNotOptimize(Moe(x, w, m.top_k, 1.0, dispatch));
  // Three matmuls of dim x expert width per token and expert it runs: the shared one and top_k.
  const double flops = 6.0 * static_cast<double>(tokens) * c.dim *
                       (m.shared_dim + static_cast<double>(m.top_k) * m.expert_dim);
  state.counters["useful_GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Moe)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->UseRealTime();

// SwiGLU's gate, silu(a)·b, on one MoE piece of the bench config (the gate and up halves of a
// [256, 512] product, as a piece's thread runs it): args {dtype: 0 bf16, 1 float32}. GB/s of its
// operands read and its output written.
void BM_SiluMul(benchmark::State& state) {
  torch::set_num_threads(1);
  const auto dt = state.range(0) == 0 ? torch::kBFloat16 : torch::kFloat32;
  torch::manual_seed(3);
  const auto gu = torch::randn({256, 512}, torch::TensorOptions().dtype(dt)).chunk(2, -1);
  for (auto _ : state) benchmark::DoNotOptimize(cpu::SiluMul(gu[0], gu[1]));
  state.counters["GB/s"] = benchmark::Counter(3.0 * 256 * 256 * gu[0].element_size() / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SiluMul)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();

// One attention call of the bench encoder layout (2 heads of 64, bf16): arg 0 sparse, 1 dense.
void BM_EncoderAttention(benchmark::State& state) {
  torch::set_num_threads(2);
  const BackboneConfig c = BenchConfig();
  const MaskKey key = EncoderMaskKey(kBenchLayout, c.flex_block_size);
  const TokenTags tags = *WindowTags(key.slots, key.chunk_size);
  const MaskRule rule = ChunkCausalRule(tags);
  const int64_t t = tags.length();
  const auto bf = torch::TensorOptions().dtype(torch::kBFloat16);
  torch::manual_seed(1);
  const torch::Tensor q = torch::randn({1, c.num_heads, t, c.head_dim()}, bf);
  const torch::Tensor k = torch::randn({1, c.num_heads, t, c.head_dim()}, bf);
  const torch::Tensor v = torch::randn({1, c.num_heads, t, c.head_dim()}, bf);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim()));
  const double flops = 4.0 * c.head_dim() * c.num_heads * AllowedPairs(rule, tags, tags);
  if (state.range(0) == 0) {
    const AttentionPlan plan =
        BuildAttentionPlan(*BuildBlockMask(rule, tags, tags, 128), rule, tags, tags, torch::kCPU,
                           torch::kBFloat16, c.head_dim());
    state.counters["groups"] = static_cast<double>(plan.groups.size());
    for (auto _ : state) benchmark::DoNotOptimize(SparseAttention(q, k, v, plan, scale));
  } else {
    const torch::Tensor dense = DenseMask(rule, t, t);
    for (auto _ : state) benchmark::DoNotOptimize(DenseAttention(q, k, v, dense, scale));
  }
  state.counters["useful_GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_EncoderAttention)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3)
    ->UseRealTime();

// One attention call of the bench config's heads (2 of 64, 1 kv head) at the small layout, on the
// CPU's tile kernel (bf16 on the matrix units where the CPU has them, float32 on FMAs): args
// {tower: 0 encoder, 1 decoder; dtype: 0 bf16, 1 float32; rows; spread}. Its useful GFLOP/s
// (allowed pairs) is held against BM_Matmul's in the same dtype: the largest non-GEMM share of a
// bench small float32 step of 8 rows. spread scales q: scores of std ~1 nat at 1, ~30 at 30, where
// most of a row lies over 87 nats below its max (e^-87 underflows float32's normal range) — the
// softmax's exp must cost the same there.
void BM_SmallAttention(benchmark::State& state) {
  torch::set_num_threads(2);
  const BackboneConfig c = BenchConfig();
  WindowLayout layout = bench::kSmallLayout;
  layout.registers = c.num_registers;
  const MaskKey key = state.range(0) == 0
                          ? EncoderMaskKey(layout, c.flex_block_size)
                          : DecoderMaskKey(layout, c.ph(), c.pw(), c.flex_block_size);
  const TokenTags tags = *WindowTags(key.slots, key.chunk_size);
  const MaskRule rule = ChunkCausalRule(tags);
  const int64_t t = tags.length(), rows = state.range(2), hd = c.head_dim();
  const auto dt = state.range(1) == 0 ? torch::kBFloat16 : torch::kFloat32;
  const auto opts = torch::TensorOptions().dtype(dt);
  torch::manual_seed(4);
  const torch::Tensor q =
      (torch::randn({rows, c.num_heads, t, hd}) * static_cast<double>(state.range(3))).to(dt);
  const torch::Tensor k = torch::randn({rows, c.num_kv_heads, t, hd}, opts);
  const torch::Tensor v = torch::randn({rows, c.num_kv_heads, t, hd}, opts);
  const AttentionPlan plan = BuildAttentionPlan(
      *BuildBlockMask(rule, tags, tags, c.flex_block_size), rule, tags, tags, torch::kCPU, dt, hd);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (auto _ : state) benchmark::DoNotOptimize(SparseAttention(q, k, v, plan, scale));
  const double flops =
      4.0 * static_cast<double>(hd * c.num_heads * rows) * AllowedPairs(rule, tags, tags);
  state.counters["useful_GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SmallAttention)
    ->ArgsProduct({{0, 1}, {0, 1}, {1, 8}, {1}})
    ->Args({0, 0, 8, 30})
    ->Args({0, 1, 8, 30})
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.5)
    ->UseRealTime();

}  // namespace
}  // namespace praxis::model

BENCHMARK_MAIN();
