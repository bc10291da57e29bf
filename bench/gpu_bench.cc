// gpu_bench (issue 14): the eager forward of one config on one device, as one JSON object on
// stdout, for scripts/gpu-check.sh to put in its summary:
//  - step latency p50/p90 of VideoBackbone::Forward (inputs already on the device, synchronised
//    before and after) at the bench layout and a small one, with sparse and with dense attention;
//  - useful TFLOP/s (model::ComputeStepCost, as bench/model_bench.cc counts them) against the same
//    device's bf16 GEMM TFLOP/s measured in this run;
//  - device memory: the CUDA caching allocator's current and peak bytes, or the RSS on cpu.
//  - on CUDA, the same step from host inputs eager and replayed from its CUDA graph (capture time,
//    p50s, their ratio, the graph's bytes).
// Random weights (model_loader's config path).
// Run: build/bench/gpu_bench --device=cuda --config=configs/praxis-1-reduced.json

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/small_layout.h"
#include "bench/stats.h"
#include "common/flag_lists.h"
#include "common/status_macros.h"
#include "model/model_loader.h"
#include "model/step_cost.h"
#include "model/step_graphs.h"
#include "nlohmann/json.hpp"
#include "wire/layout_key.h"
#include "wire/synthetic.h"

ABSL_FLAG(std::string, device, "cuda", "cpu | cuda | cuda:N");
ABSL_FLAG(std::string, config, "configs/bench.json", "config.json served with random weights");
ABSL_FLAG(std::string, dtype, "", "parameter dtype; empty keeps the config's");
ABSL_FLAG(std::string, layouts, "bench,small", "comma-separated layouts: bench | small");
ABSL_FLAG(std::string, attention, "sparse,dense", "comma-separated attention modes to time");
ABSL_FLAG(
    std::string, small_rows, "1",
    "comma-separated batch rows of the small layout (each a layouts entry small_xN beyond 1)");
ABSL_FLAG(int, repeats, 10, "timed steps per layout and mode (after one untimed warm-up)");
ABSL_FLAG(int, gemm_n, 0, "side of the bf16 GEMM; 0: 8192 on cuda, 1024 on cpu");
ABSL_FLAG(int, threads, 0, "LibTorch intra-op threads; 0 keeps LibTorch's default");

namespace praxis::model {
namespace {

using Json = nlohmann::ordered_json;

using bench::kSmallLayout;

int CudaIndex(const torch::Device& d) { return d.index() < 0 ? 0 : d.index(); }

void Sync(const torch::Device& d) {
  if (d.is_cuda()) torch::cuda::synchronize(CudaIndex(d));
}

// The bf16 matmul rate of `d` in TFLOP/s: 3 untimed, then 10 timed products of n x n by n x n.
double GemmTflops(const torch::Device& d, int64_t n) {
  const auto opts = torch::TensorOptions().dtype(torch::kBFloat16).device(d);
  const torch::Tensor a = torch::randn({n, n}, opts), b = torch::randn({n, n}, opts);
  for (int i = 0; i < 3; ++i) torch::matmul(a, b);
  Sync(d);
  constexpr int kTimed = 10;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kTimed; ++i) torch::matmul(a, b);
  Sync(d);
  return kTimed * 2.0 * n * n * n / absl::ToDoubleSeconds(absl::Now() - start) / 1e12;
}

// Allocator bytes on cuda (current, peak since the last reset); VmRSS and VmHWM on cpu.
Json Memory(const torch::Device& d) {
  if (d.is_cuda()) {
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(d));
    const auto& all =
        s.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return {{"kind", "cuda_allocator"}, {"current_bytes", all.current}, {"peak_bytes", all.peak}};
  }
  Json j = {{"kind", "rss"}};
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    for (const char* key : {"VmRSS", "VmHWM"}) {
      if (line.rfind(std::string(key) + ":", 0) != 0) continue;
      std::vector<std::string> w = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      j[key == std::string("VmRSS") ? "current_bytes" : "peak_bytes"] = std::stoll(w[1]) * 1024;
    }
  }
  return j;
}

// `repeats` timed calls of `step` (each synchronised), in ms; an error stops the timing.
absl::StatusOr<std::vector<double>> Timed(const torch::Device& d, int repeats,
                                          const std::function<absl::Status()>& step) {
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const absl::Time t0 = absl::Now();
    PRAXIS_RETURN_IF_ERROR(step());
    Sync(d);
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  return ms;
}

// The same step from host inputs, eager and through its captured CUDA graph (model/step_graphs.h):
// what a served batch costs either way (staging included).
Json TimeGraphs(VideoBackbone& model, const StepInputs& host_in, int repeats) {
  const torch::Device d = model.options().device;
  StepGraphs graphs(model, int64_t{64} << 30);
  absl::Time t0 = absl::Now();
  const absl::Status captured = graphs.Capture(host_in);
  Sync(d);
  if (!captured.ok()) return {{"error", captured.ToString()}};
  const double capture_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  const auto eager = Timed(d, repeats, [&] { return model.ForwardValidated(host_in).status(); });
  const auto graph = Timed(d, repeats, [&] { return graphs.Run(host_in).status(); });
  if (!eager.ok() || !graph.ok()) {
    return {{"error", (eager.ok() ? graph.status() : eager.status()).ToString()}};
  }
  const double e = bench::Median(*eager), g = bench::Median(*graph);
  return {{"capture_ms", capture_ms},  {"eager_host_inputs_p50_ms", e},
          {"graph_p50_ms", g},         {"graph_p90_ms", bench::Quantile(*graph, 0.9)},
          {"eager_over_graph", e / g}, {"graph_bytes", graphs.stats().cache.bytes}};
}

// Cold (first, builds the masks) and timed steps of `model` on `rows` rows of `layout`, with
// their useful rate; on CUDA also the graph's.
Json TimeLayout(VideoBackbone& model, const WindowLayout& layout, int64_t rows, int repeats,
                double gemm) {
  const torch::Device d = model.options().device;
  const StepInputs host_in =
      wire::SyntheticInputs(model.config().step_dims(), GeometryOf(layout), rows, /*seed=*/0);
  absl::StatusOr<StepInputs> in = model.OnDevice(host_in);
  if (!in.ok()) return {{"error", in.status().ToString()}};
  Sync(d);
  const absl::Time t0 = absl::Now();
  absl::Status cold = model.Forward(*in).status();
  Sync(d);
  if (!cold.ok()) return {{"error", cold.ToString()}};
  const double cold_ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  const auto ms = Timed(d, repeats, [&] { return model.Forward(*in).status(); });
  if (!ms.ok()) return {{"error", ms.status().ToString()}};
  WindowLayout counted = layout;
  counted.registers = model.config().num_registers;
  const double flops = ComputeStepCost(model.config(), counted, /*decode=*/true, rows).flops;
  const double p50 = bench::Median(*ms), tflops = flops / (p50 / 1e3) / 1e12;
  Json j = {{"cold_ms", cold_ms},
            {"p50_ms", p50},
            {"p90_ms", bench::Quantile(*ms, 0.9)},
            {"useful_tflop", flops / 1e12},
            {"useful_tflops", tflops},
            {"fraction_of_gemm", tflops / gemm}};
  if (d.is_cuda()) j["cuda_graph"] = TimeGraphs(model, host_in, repeats);
  return j;
}

// Loads the model with `mode` attention and times every --layouts entry on it (the small layout
// at each of `small_rows`).
absl::StatusOr<Json> TimeMode(const torch::Device& device, const std::string& mode,
                              const std::vector<int64_t>& small_rows, double gemm) {
  BackboneOptions options;
  options.device = device;
  PRAXIS_ASSIGN_OR_RETURN(options.attention, ParseAttention(mode, "--attention"));
  ModelSource source;
  source.config_path = absl::GetFlag(FLAGS_config);
  source.dtype = absl::GetFlag(FLAGS_dtype);
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndex(device));
  PRAXIS_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(source, options));
  Json m = {{"dtype", DtypeName(loaded.model->dtype())}, {"memory_after_load", Memory(device)}};
  const std::vector<std::string> names = absl::StrSplit(absl::GetFlag(FLAGS_layouts), ',');
  for (const std::string& name : names) {
    if (name != "bench" && name != "small") {
      return absl::InvalidArgumentError("--layouts: expected bench or small, got " + name);
    }
    const WindowLayout& layout = name == "bench" ? kBenchLayout : kSmallLayout;
    for (int64_t rows : name == "bench" ? std::vector<int64_t>{1} : small_rows) {
      const std::string entry = rows == 1 ? name : absl::StrCat(name, "_x", rows);
      m["layouts"][entry] =
          TimeLayout(*loaded.model, layout, rows, absl::GetFlag(FLAGS_repeats), gemm);
      m["layouts"][entry]["key"] = wire::LayoutKey(GeometryOf(layout), /*decode=*/true, {});
    }
  }
  m["memory"] = Memory(device);
  return m;
}

absl::StatusOr<Json> Run() {
  PRAXIS_ASSIGN_OR_RETURN(torch::Device device,
                          ParseDevice(absl::GetFlag(FLAGS_device), "--device"));
  if (device.is_cuda() && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError("--device=cuda but LibTorch sees no CUDA device");
  }
  PRAXIS_ASSIGN_OR_RETURN(const std::vector<int64_t> small_rows,
                          ParsePositiveInts(absl::GetFlag(FLAGS_small_rows), "--small_rows"));
  int64_t n = absl::GetFlag(FLAGS_gemm_n);
  if (n <= 0) n = device.is_cuda() ? 8192 : 1024;
  const double gemm = GemmTflops(device, n);
  Json j = {
      {"device", device.str()},
      {"device_name", device.is_cuda() ? at::cuda::getCurrentDeviceProperties()->name : "cpu"},
      {"torch", TORCH_VERSION},
      {"config", absl::GetFlag(FLAGS_config)},
      {"gemm_bf16", {{"n", n}, {"tflops", gemm}}}};
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_attention), ',');
  for (const std::string& mode : modes) {
    PRAXIS_ASSIGN_OR_RETURN(j["attention"][mode], TimeMode(device, mode, small_rows, gemm));
  }
  return j;
}

}  // namespace
}  // namespace praxis::model

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_repeats) < 1) {
    std::cerr << "--repeats: expected at least 1\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_threads) > 0) torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  torch::NoGradGuard no_grad;
  const absl::StatusOr<praxis::model::Json> j = praxis::model::Run();
  if (!j.ok()) {
    std::cerr << j.status() << "\n";
    return 1;
  }
  std::cout << j->dump(2) << std::endl;
  return 0;
}
