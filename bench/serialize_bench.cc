// serialize_bench: the answer's serialize path in GB/s (issue 13, "only what is asked for"): a
// batch of 8 one-row steps of configs/bench.json at the bench layout (K = 4, F = 2, h x w = 30 x
// 40) asking for velocity and cond, each answered by a StepResponder at the default chunk size,
// from fp32 outputs to an fp32, a bf16 and an fp16 wire. Beside it in the same run: a plain memcpy
// of the same wire bytes (the floor), and the previous path (clone the row, convert each chunk to a
// tensor, copy it into the message). Median and spread (max / min) of --repeats runs each, and
// the CPU model. Not a test: nothing is asserted.
// Run: build/bench/serialize_bench [--repeats=7] [--threads=2] [--max_chunk_bytes=1048576]

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/stats.h"
#include "model/config.h"
#include "model/cpu_runtime.h"
#include "model/masks.h"
#include "server/step_batch.h"
#include "server/step_response.h"
#include "wire/output_names.h"

ABSL_FLAG(int, repeats, 7, "timed runs of each path (after one untimed run)");
ABSL_FLAG(int, threads, 2, "LibTorch intra-op threads (the bf16 conversion may use them)");
ABSL_FLAG(int64_t, max_chunk_bytes, 1 << 20, "chunk payload, as praxis-server's flag");

namespace praxis::serve {
namespace {

constexpr int64_t kRows = 8;
volatile char benchmark_sink = 0;  // keeps the baseline's copies observable

// The batch's velocity [8, C, K·F, h, w] and cond [8, K·F, h, w, dim], fp32, random.
model::BackboneOutput BatchOutputs() {
  const model::BackboneConfig c =
      model::LoadConfig(std::string(PRAXIS_SOURCE_DIR) + "/configs/bench.json").value();
  const model::WindowLayout& l = model::kBenchLayout;
  model::BackboneOutput out;
  out.velocity = torch::randn({kRows, c.latent_channels(), l.k * l.f, l.h, l.w});
  out.cond = torch::randn({kRows, l.k * l.f, l.h, l.w, c.dim});
  return out;
}

// The 8 callers' answers as the server makes them: one responder per row slice. Returns bytes.
int64_t Serve(const model::BackboneOutput& batch, const OutputPlan& plan, int64_t chunk) {
  int64_t bytes = 0;
  v1::StepResponse msg;
  for (int64_t row = 0; row < kRows; ++row) {
    StepResult r{SliceRows(batch, row, 1), "bench", absl::ZeroDuration(), absl::ZeroDuration(),
                 kRows};
    StepResponder s = StepResponder::Create(r, plan, "id", absl::Now(), chunk).value();
    while (*s.Next(&msg)) {
      if (msg.has_chunk()) bytes += static_cast<int64_t>(msg.chunk().data().size());
    }
  }
  return bytes;
}

// What StepResponder did before: the row cloned to own it, then per chunk a converted tensor
// copied into the message (up to three copies of each byte).
int64_t Previous(const model::BackboneOutput& batch, const OutputPlan& plan, int64_t chunk) {
  const torch::ScalarType wire = plan.wire_dtype == v1::FLOAT32    ? torch::kFloat32
                                 : plan.wire_dtype == v1::BFLOAT16 ? torch::kBFloat16
                                                                   : torch::kFloat16;
  const int64_t size = static_cast<int64_t>(c10::elementSize(wire));
  int64_t bytes = 0;
  v1::TensorChunk msg;
  for (int64_t row = 0; row < kRows; ++row) {
    for (const torch::Tensor* t : {&batch.velocity, &batch.cond}) {
      torch::Tensor flat = t->narrow(0, row, 1).to(torch::kCPU).contiguous().view({-1});
      if (flat.storage().nbytes() > flat.nbytes()) flat = flat.clone();
      for (int64_t e = 0; e < flat.numel(); e += chunk / size) {
        const int64_t n = std::min(chunk / size, flat.numel() - e);
        const torch::Tensor part = flat.narrow(0, e, n).to(wire).contiguous();
        msg.set_data(static_cast<const char*>(part.data_ptr()), n * size);
        bytes += static_cast<int64_t>(msg.data().size());
      }
    }
  }
  return bytes;
}

// The floor: as many bytes as the answers carry, memcpy'd from the outputs chunk by chunk into a
// chunk-sized buffer (as each chunk's message is a chunk-sized string).
int64_t Memcpy(const model::BackboneOutput& batch, int64_t wire_bytes, int64_t chunk,
               std::string& buffer) {
  buffer.resize(static_cast<size_t>(chunk));
  int64_t copied = 0;
  for (const torch::Tensor* t : {&batch.velocity, &batch.cond}) {
    const char* from = static_cast<const char*>(t->data_ptr());
    const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(t->nbytes()), wire_bytes - copied);
    for (int64_t at = 0; at < bytes; at += chunk) {
      const int64_t n = std::min(chunk, bytes - at);
      std::memcpy(buffer.data(), from + at, static_cast<size_t>(n));
      benchmark_sink = buffer[0];
    }
    copied += bytes;
  }
  return copied;
}

struct Figure {
  double median_gbps = 0;
  double spread = 0;  // max / min
};

Figure Time(const std::function<int64_t()>& run) {
  run();  // untimed: first touches, allocator warm-up
  std::vector<double> gbps;
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    const auto start = std::chrono::steady_clock::now();
    const int64_t bytes = run();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    gbps.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  return {bench::Median(gbps), bench::Spread(gbps)};
}

void Run() {
  torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  const int64_t chunk = absl::GetFlag(FLAGS_max_chunk_bytes);
  const model::BackboneOutput batch = BatchOutputs();
  std::printf("cpu: %s; %d intra-op threads; chunk %lld bytes; %d repeats\n",
              model::DetectCpuIsa().model.c_str(), torch::get_num_threads(),
              static_cast<long long>(chunk), absl::GetFlag(FLAGS_repeats));
  std::string buffer;
  for (const v1::DType wire : {v1::FLOAT32, v1::BFLOAT16, v1::FLOAT16}) {
    OutputPlan plan;
    plan.velocity = true;
    plan.cond = true;
    plan.wire_dtype = wire;
    const int64_t wire_bytes = Serve(batch, plan, chunk);
    const Figure now = Time([&] { return Serve(batch, plan, chunk); });
    const Figure before = Time([&] { return Previous(batch, plan, chunk); });
    const Figure floor = Time([&] { return Memcpy(batch, wire_bytes, chunk, buffer); });
    std::printf(
        "%s wire, %.1f MB per batch: StepResponder %.2f GB/s (spread %.2f), previous path %.2f "
        "GB/s (%.2f), memcpy %.2f GB/s (%.2f); StepResponder / memcpy %.2f, / previous %.2f\n",
        v1::DType_Name(wire).c_str(), wire_bytes / 1e6, now.median_gbps, now.spread,
        before.median_gbps, before.spread, floor.median_gbps, floor.spread,
        now.median_gbps / floor.median_gbps, now.median_gbps / before.median_gbps);
  }
}

}  // namespace
}  // namespace praxis::serve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  praxis::serve::Run();
  return 0;
}
