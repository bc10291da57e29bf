// praxis-server on cuda as a process (issue 14): a step served through the real server and client
// equals the same step computed in process on the same device with the same weights (the embedded
// tiny model, seed 0). Skipped without a CUDA device; needs PRAXIS_SERVER_BIN.

#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <utility>
#include <vector>

#include "client/request_builder.h"
#include "tests/e2e/server_process.h"
#include "tests/gpu/gpu_compare.h"
#include "wire/synthetic.h"

namespace praxis::model::gpu {
namespace {

// Same device, same kernels, float32 on the wire: only batching could reorder anything.
constexpr double kServedTolerance = 1e-6;

TEST(GpuServedTest, StepServedOnCudaEqualsTheInProcessStep) {
  PRAXIS_SKIP_WITHOUT_CUDA();
  serve::fixtures::ServerProcess p({"--device=cuda", "--warmup=5,3,4,2,1"});
  ASSERT_GT(p.pid(), 0) << "set PRAXIS_SERVER_BIN";
  ASSERT_TRUE(p.WaitServing()) << p.log();
  EXPECT_NE(p.start_line().find("device cuda"), std::string::npos) << p.start_line();
  const wire::StepGeometry layout{
      .text_len = 5, .anchor_h = 3, .anchor_w = 4, .k = 2, .f = 1, .h = 3, .w = 4};
  auto local = Load("", "cuda", "");
  ASSERT_TRUE(local);
  const StepInputs in = wire::SyntheticInputs(local->config().step_dims(), layout, 1, /*seed=*/6);
  client::RequestOptions o;
  o.outputs = {"velocity", "cond", "taps", "embeddings", "positions"};
  const absl::StatusOr<client::StepReply> r = serve::fixtures::Connect(p.port())->Step(
      client::MakeStepRequest(in, o).value(), absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status() << "\n" << p.log();
  std::vector<std::pair<std::string, torch::Tensor>> served;
  const std::vector<std::pair<std::string, torch::Tensor>> want = Outputs(*local, in);
  for (const auto& [name, t] : want) {
    ASSERT_EQ(r->tensors.count(name), 1u) << name;
    const torch::Tensor& s = r->tensors.at(name);
    served.emplace_back(name, s.is_floating_point() ? s.to(torch::kFloat64) : s);
  }
  ExpectOutputsClose(served, want, ScaledMaxDiff, kServedTolerance, "served vs in-process");
  kill(p.pid(), SIGTERM);
  EXPECT_EQ(p.WaitExit(), 0) << p.log();
}

}  // namespace
}  // namespace praxis::model::gpu
