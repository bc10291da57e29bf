// The server's overhead and batching, on configs/bench.json and the bench layout (bf16 weights,
// random), in one run:
//  (a) served end-to-end p50 latency of one step vs the in-process forward of the same step
//      (target <= 1.10 on CPU);
//  (b) throughput of 8 closed-loop callers with batching on (--max_batch_size 8) vs off (1).
// Run: build/bench/serve_bench [--repeats=N] [--rounds=R] [--threads=T] [--dtype=float32]
// (PRAXIS_SOURCE_DIR is compiled in).

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/small_layout.h"
#include "bench/stats.h"
#include "client/praxis_client.h"
#include "client/request_builder.h"
#include "model/model_loader.h"
#include "server/server.h"
#include "wire/synthetic.h"

ABSL_FLAG(int, repeats, 5, "timed steps for each latency figure");
ABSL_FLAG(int, rounds, 2, "steps per caller for each throughput figure");
ABSL_FLAG(int, threads, 2, "LibTorch intra-op threads");
ABSL_FLAG(std::string, dtype, "",
          "model dtype; empty keeps the config's bfloat16 (use float32 on CPUs without bf16 "
          "matmul units, where bf16 is emulated and a step takes ~30x longer)");

namespace praxis::serve {
namespace {

constexpr int kCallers = 8;
constexpr absl::Duration kTimeout = absl::Minutes(10);

std::unique_ptr<model::StepRunner> BenchRunner() {
  model::ModelSource source;
  source.config_path = std::string(PRAXIS_SOURCE_DIR) + "/configs/bench.json";
  source.dtype = absl::GetFlag(FLAGS_dtype);
  return std::make_unique<model::BackboneStepRunner>(
      std::move(model::LoadModel(source, {}).value().model));
}

// Velocity and both taps, bfloat16 on the wire: what a robot's control loop asks for.
v1::StepRequest BenchRequest(const model::StepInputs& in) {
  client::RequestOptions o;
  o.outputs = {"velocity", "taps"};
  o.wire_dtype = v1::BFLOAT16;
  return client::MakeStepRequest(in, o).value();
}

std::unique_ptr<PraxisServer> Serve(std::unique_ptr<model::StepRunner> runner, int64_t batch) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.metrics_address = "";
  o.batch.max_batch_rows = batch;
  o.batch.max_queue_delay = absl::Milliseconds(5);
  auto server = PraxisServer::Create(o, std::move(runner)).value();
  const wire::StepGeometry warm{
      .text_len = 4, .anchor_h = 2, .anchor_w = 2, .k = 1, .f = 1, .h = 2, .w = 2};
  if (!server->Warmup(warm).ok()) std::abort();
  return server;
}

// Steps per second of kCallers closed-loop callers, each sending `rounds` steps.
double Throughput(const client::Client& c, const v1::StepRequest& r, int rounds) {
  std::vector<std::thread> callers;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&] {
      for (int n = 0; n < rounds; ++n) {
        if (!c.Step(r, kTimeout).ok()) std::abort();
      }
    });
  }
  for (std::thread& t : callers) t.join();
  return kCallers * rounds / absl::ToDoubleSeconds(absl::Now() - start);
}

void Run() {
  torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  const int repeats = absl::GetFlag(FLAGS_repeats);
  std::unique_ptr<model::StepRunner> runner = BenchRunner();
  const model::StepInputs in = wire::SyntheticInputs(
      runner->config().step_dims(), model::GeometryOf(model::kBenchLayout), 1, /*seed=*/0);
  const v1::StepRequest request = BenchRequest(in);
  const auto all =
      model::OutputSelection::All(static_cast<int>(runner->config().encoder.tap_blocks.size()));

  // (a) The same model object, first in process, then behind the server.
  const absl::Time cold = absl::Now();
  if (!runner->Run(in, all).ok()) std::abort();  // builds the masks
  std::printf("cold in-process step %.1f ms\n", absl::ToDoubleMilliseconds(absl::Now() - cold));
  std::vector<double> local, served, server_compute;
  for (int i = 0; i < repeats; ++i) {
    const absl::Time t = absl::Now();
    if (!runner->Run(in, all).ok()) std::abort();
    local.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
  }
  std::unique_ptr<PraxisServer> server = Serve(std::move(runner), 8);
  auto c = client::Client::Create(absl::StrCat("127.0.0.1:", server->port())).value();
  if (!c->Step(request, kTimeout).ok()) std::abort();
  for (int i = 0; i < repeats; ++i) {
    const absl::Time t = absl::Now();
    const absl::StatusOr<client::StepReply> r = c->Step(request, kTimeout);
    if (!r.ok()) std::abort();
    served.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
    server_compute.push_back(r->header.compute_us() / 1e3);
  }
  std::printf(
      "(a) in-process forward p50 %.1f ms; served end-to-end p50 %.1f ms "
      "(server compute p50 %.1f ms): ratio %.3f (target <= 1.10)\n",
      bench::Median(local), bench::Median(served), bench::Median(server_compute),
      bench::Median(served) / bench::Median(local));

  // (b) The same 8 callers against batching on, then off, on the bench layout and on a small
  // one (where a row's work is too small to keep the cores busy alone).
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::unique_ptr<PraxisServer> solo = Serve(BenchRunner(), 1);
  auto c1 = client::Client::Create(absl::StrCat("127.0.0.1:", solo->port())).value();
  const model::BackboneConfig& config = server->model().config();
  for (const auto& [name, layout] :
       {std::pair{"bench", model::kBenchLayout}, {"small", bench::kSmallLayout}}) {
    const v1::StepRequest r =
        BenchRequest(wire::SyntheticInputs(config.step_dims(), model::GeometryOf(layout), 1, 1));
    if (!c->Step(r, kTimeout).ok() || !c1->Step(r, kTimeout).ok()) std::abort();  // masks
    const int n = name == std::string("small") ? 20 * rounds : rounds;
    const double on = Throughput(*c, r, n);
    const double off = Throughput(*c1, r, n);
    std::printf(
        "(b) %s layout, %d callers x %d steps: batching on %.3f steps/s, off %.3f "
        "steps/s: ratio %.2f\n",
        name, kCallers, n, on, off, on / off);
  }
}

}  // namespace
}  // namespace praxis::serve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);  // each figure as soon as it is measured
  praxis::serve::Run();
  return 0;
}
