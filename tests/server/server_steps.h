#pragma once

// What the server tests (on the fake and on the tiny model) share: the layouts they step, the
// requests they send, and a bounded poll for states with no event to wait on.

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/request_builder.h"
#include "model/step.h"
#include "praxis/v1/praxis.pb.h"
#include "wire/synthetic.h"

namespace praxis::serve::fixtures {

inline constexpr absl::Duration kTimeout = absl::Seconds(60);

// Three layouts of the tiny model: K = 2, K = 1 with F = 2, K = 3.
inline constexpr wire::StepGeometry kLayouts[] = {
    {.text_len = 5, .anchor_h = 3, .anchor_w = 4, .k = 2, .f = 1, .h = 3, .w = 4},
    {.text_len = 7, .anchor_h = 2, .anchor_w = 2, .k = 1, .f = 2, .h = 4, .w = 4},
    {.text_len = 3, .anchor_h = 4, .anchor_w = 4, .k = 3, .f = 1, .h = 2, .w = 5},
};

// A request of `rows` rows for `layout` with inputs drawn from `seed`, asking for every output.
inline v1::StepRequest Request(const model::BackboneConfig& config,
                               const wire::StepGeometry& layout, uint64_t seed, bool decode = true,
                               int64_t rows = 1) {
  model::StepInputs in = wire::SyntheticInputs(config.step_dims(), layout, rows, seed);
  in.decode = decode;
  client::RequestOptions o;
  o.outputs = {"cond", "taps", "embeddings", "positions"};
  if (decode) o.outputs.push_back("velocity");
  o.request_id = absl::StrCat("req-", seed);
  return client::MakeStepRequest(in, o).value();
}

// Every output of `out` by its streamed name.
inline std::map<std::string, torch::Tensor> ByName(const model::BackboneOutput& out) {
  std::map<std::string, torch::Tensor> m;
  for (auto& [name, t] : model::NamedOutputs(out)) m[name] = t;
  return m;
}

inline double MaxAbsDiff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// Polls `done` every millisecond for at most `timeout`; for states with no event to wait on.
template <typename F>
bool Eventually(F done, absl::Duration timeout = absl::Seconds(60)) {
  for (const absl::Time end = absl::Now() + timeout; absl::Now() < end;) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

}  // namespace praxis::serve::fixtures
