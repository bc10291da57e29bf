// decode_bench: the request path's CPU per step (issue 13, "served p50 / in-process"): what a gRPC
// thread does with one StepRequest before it is queued — parse the message's bytes, then
// DecodeStepRequest (tensors, checks, cost) — for one row of the embedded tiny model and of
// configs/bench.json at the small layout (32,6,8,2,1), float32 on the wire. Median and spread
// (max / min) of --repeats runs of --steps requests each, and the CPU model. One thread, as gRPC's
// threads run it. Not a test: nothing is asserted.
// Run: build/bench/decode_bench [--repeats=7] [--steps=2000]

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/small_layout.h"
#include "bench/stats.h"
#include "client/request_builder.h"
#include "model/config.h"
#include "model/cpu_runtime.h"
#include "model/masks.h"
#include "model/model_loader.h"
#include "server/step_request.h"
#include "wire/synthetic.h"

ABSL_FLAG(int, repeats, 7, "timed runs of --steps requests each (after one untimed run)");
ABSL_FLAG(int, steps, 2000, "requests decoded per run");

namespace praxis::serve {
namespace {

volatile int64_t benchmark_sink = 0;  // keeps each decoded step observable

// µs per request: parse + DecodeStepRequest of `bytes`, --steps times; exits on a refusal (the
// request is one the server accepts).
double MicrosPerRequest(const std::string& bytes, const model::BackboneConfig& config) {
  const int steps = absl::GetFlag(FLAGS_steps);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    v1::StepRequest r;
    if (!r.ParseFromString(bytes)) {
      std::fprintf(stderr, "decode_bench: the request does not parse\n");
      std::exit(1);
    }
    absl::StatusOr<DecodedStep> step = DecodeStepRequest(r, config);
    if (!step.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", step.status().ToString().c_str());
      std::exit(1);
    }
    benchmark_sink = benchmark_sink + step->inputs.noised.numel();
  }
  const std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
  return took.count() / steps;
}

int Run() {
  model::DefaultToOneIntraOpThread();
  std::printf("cpu: %s; %d repeats of %d requests\n", model::DetectCpuIsa().model.c_str(),
              absl::GetFlag(FLAGS_repeats), absl::GetFlag(FLAGS_steps));
  struct Model {
    const char* name;
    absl::StatusOr<model::BackboneConfig> config;
  };
  const std::vector<Model> models = {
      {"tiny", model::ParseConfig(model::kEmbeddedTinyConfig)},
      {"bench", model::LoadConfig(std::string(PRAXIS_SOURCE_DIR) + "/configs/bench.json")}};
  const wire::StepGeometry g = model::GeometryOf(bench::kSmallLayout);
  for (const Model& m : models) {
    if (!m.config.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", m.config.status().ToString().c_str());
      return 1;
    }
    const wire::StepInputs in = wire::SyntheticInputs(m.config->step_dims(), g, 1, /*seed=*/0);
    absl::StatusOr<v1::StepRequest> request = client::MakeStepRequest(in, {});
    if (!request.ok()) {
      std::fprintf(stderr, "decode_bench: %s\n", request.status().ToString().c_str());
      return 1;
    }
    const std::string bytes = request->SerializeAsString();
    MicrosPerRequest(bytes, *m.config);  // warm-up
    std::vector<double> us;
    for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
      us.push_back(MicrosPerRequest(bytes, *m.config));
    }
    std::printf("%-5s small, %zu request bytes: %.1f us per request (spread %.2f)\n", m.name,
                bytes.size(), bench::Median(us), bench::Spread(us));
  }
  return 0;
}

}  // namespace
}  // namespace praxis::serve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return praxis::serve::Run();
}
