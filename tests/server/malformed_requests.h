#pragma once

// The malformed-request table shared by the decoder's unit test and the server's end-to-end test:
// each case mutates a valid tiny-model request and names the field its error must start with.

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "praxis/v1/praxis.pb.h"
#include "wire/tensor_codec.h"

namespace praxis::serve::fixtures {

inline v1::Tensor Wire(const torch::Tensor& t) { return *wire::EncodeTensor(t, v1::FLOAT32); }

// A valid request for the tiny model: B = 1, K = 2, F = 1, h x w = 3 x 4, text 5.
inline v1::StepRequest Valid() {
  torch::manual_seed(0);
  v1::StepRequest r;
  *r.mutable_text() = Wire(torch::randn({1, 5, 48}));
  *r.mutable_anchor() = Wire(torch::randn({1, 16, 1, 3, 4}));
  *r.mutable_clean() = Wire(torch::randn({1, 16, 1, 3, 4}));
  *r.mutable_noised() = Wire(torch::randn({1, 16, 2, 3, 4}));
  *r.mutable_timesteps() = Wire(torch::rand({1, 2}));
  r.set_frames_per_chunk(1);
  r.set_decode(true);
  r.mutable_outputs()->set_velocity(true);
  r.mutable_outputs()->set_all_taps(true);
  return r;
}

struct Malformed {
  std::string name;
  std::function<void(v1::StepRequest&)> mutate;
  std::string field;  // the error message must start with it
};

// At least 25 cases; each must be refused INVALID_ARGUMENT naming `field`.
inline std::vector<Malformed> MalformedCases() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<Malformed> cases = {
      {"no text", [](auto& r) { r.clear_text(); }, "text"},
      {"no noised", [](auto& r) { r.clear_noised(); }, "noised"},
      {"no timesteps", [](auto& r) { r.clear_timesteps(); }, "timesteps"},
      {"no anchor", [](auto& r) { r.clear_anchor(); }, "anchor"},
      {"text bytes short", [](auto& r) { r.mutable_text()->mutable_data()->resize(10); },
       "text.data"},
      {"noised bytes long", [](auto& r) { r.mutable_noised()->mutable_data()->append("xx"); },
       "noised.data"},
      {"unknown dtype", [](auto& r) { r.mutable_anchor()->set_dtype(static_cast<v1::DType>(42)); },
       "anchor.dtype"},
      {"unspecified dtype", [](auto& r) { r.mutable_clean()->set_dtype(v1::DTYPE_UNSPECIFIED); },
       "clean.dtype"},
      {"negative dim", [](auto& r) { r.mutable_timesteps()->set_shape(0, -1); }, "timesteps.shape"},
      {"int64 noised",
       [](auto& r) {
         *r.mutable_noised() =
             *wire::EncodeTensor(torch::zeros({1, 16, 2, 3, 4}, torch::kInt64), v1::FLOAT32);
       },
       "noised"},
      {"wrong channels",
       [](auto& r) {
         *r.mutable_noised() = Wire(torch::zeros({1, 8, 2, 3, 4}));
       },
       "noised"},
      {"noised rank 4",
       [](auto& r) {
         *r.mutable_noised() = Wire(torch::zeros({1, 16, 2, 12}));
       },
       "noised"},
      {"text width",
       [](auto& r) {
         *r.mutable_text() = Wire(torch::zeros({1, 5, 47}));
       },
       "text"},
      {"empty text",
       [](auto& r) {
         *r.mutable_text() = Wire(torch::zeros({1, 0, 48}));
       },
       "text"},
      {"text batch",
       [](auto& r) {
         *r.mutable_text() = Wire(torch::zeros({2, 5, 48}));
       },
       "text"},
      {"F not dividing frames", [](auto& r) { r.set_frames_per_chunk(3); }, "frames_per_chunk"},
      {"F zero", [](auto& r) { r.set_frames_per_chunk(0); }, "frames_per_chunk"},
      {"K mismatch timesteps",
       [](auto& r) {
         *r.mutable_timesteps() = Wire(torch::rand({1, 3}));
       },
       "timesteps"},
      {"timestep above 1",
       [](auto& r) {
         *r.mutable_timesteps() = Wire(torch::tensor({{0.5f, 1.5f}}));
       },
       "timesteps"},
      {"timestep negative",
       [](auto& r) {
         *r.mutable_timesteps() = Wire(torch::tensor({{-0.1f, 0.5f}}));
       },
       "timesteps"},
      {"timestep NaN",
       [nan](auto& r) {
         *r.mutable_timesteps() = Wire(torch::tensor({{nan, 0.5f}}));
       },
       "timesteps"},
      {"noised inf",
       [](auto& r) {
         torch::Tensor t = torch::zeros({1, 16, 2, 3, 4});
         t[0][0][0][0][0] = std::numeric_limits<float>::infinity();
         *r.mutable_noised() = Wire(t);
       },
       "noised"},
      {"clean with K == 1",
       [](auto& r) {
         *r.mutable_noised() = Wire(torch::zeros({1, 16, 1, 3, 4}));
         *r.mutable_timesteps() = Wire(torch::rand({1, 1}));
       },
       "clean"},
      {"clean missing with K == 2", [](auto& r) { r.clear_clean(); }, "clean"},
      {"clean frames wrong",
       [](auto& r) {
         *r.mutable_clean() = Wire(torch::zeros({1, 16, 2, 3, 4}));
       },
       "clean"},
      {"grid too wide",
       [](auto& r) {
         *r.mutable_noised() = Wire(torch::zeros({1, 16, 2, 1, 361}));
         *r.mutable_clean() = Wire(torch::zeros({1, 16, 1, 1, 361}));
       },
       "noised"},
      {"decoder grid too tall",
       [](auto& r) {
         *r.mutable_noised() = Wire(torch::zeros({1, 16, 2, 200, 1}));
         *r.mutable_clean() = Wire(torch::zeros({1, 16, 1, 200, 1}));
       },
       "noised"},
      {"anchor frames",
       [](auto& r) {
         *r.mutable_anchor() = Wire(torch::zeros({1, 16, 2, 3, 4}));
       },
       "anchor"},
      {"rope shifts count", [](auto& r) { r.add_rope_shifts(1); }, "rope_shifts"},
      {"rope shift range",
       [](auto& r) {
         for (int i = 0; i < 4; ++i) r.add_rope_shifts(i == 2 ? 129600 : 0);
       },
       "rope_shifts[2]"},
      {"tap out of range",
       [](auto& r) {
         r.mutable_outputs()->set_all_taps(false);
         r.mutable_outputs()->add_taps(7);
       },
       "outputs.taps"},
      {"taps and all_taps", [](auto& r) { r.mutable_outputs()->add_taps(0); }, "outputs.taps"},
      {"no outputs", [](auto& r) { r.clear_outputs(); }, "outputs"},
      {"velocity without decode", [](auto& r) { r.set_decode(false); }, "outputs.velocity"},
      {"int64 wire dtype", [](auto& r) { r.set_wire_dtype(v1::INT64); }, "wire_dtype"},
      {"huge shape",
       [](auto& r) {
         r.mutable_text()->clear_shape();
         for (int i = 0; i < 3; ++i) r.mutable_text()->add_shape(int64_t{1} << 30);
       },
       "text.shape"},
  };
  // Hostile input (issue 12): repeated taps, shapes whose byte count wraps or hides behind a zero,
  // huge finite values.
  cases.push_back({"repeated tap",
                   [](auto& r) {
                     r.mutable_outputs()->set_all_taps(false);
                     for (int i = 0; i < 1500; ++i) r.mutable_outputs()->add_taps(0);
                   },
                   "outputs.taps"});
  const int64_t big = int64_t{1} << 62, half = int64_t{1} << 31, huge = int64_t{1} << 40;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"[2^62]", {big}},
           {"[2^31, 2^31]", {half, half}},
           {"[2^62, 1, 1]", {big, 1, 1}},
           {"[0, 2^40, 2^40]", {0, huge, huge}}}) {
    for (const char* field : {"noised", "text"}) {
      cases.push_back({absl::StrCat(field, " ", name),
                       [field = std::string(field), shape = shape](auto& r) {
                         v1::Tensor* t = field == "noised" ? r.mutable_noised() : r.mutable_text();
                         t->clear_shape();
                         t->clear_data();
                         for (int64_t d : shape) t->add_shape(d);
                       },
                       absl::StrCat(field, ".shape")});
    }
  }
  cases.push_back({"noised 3e38",
                   [](auto& r) {
                     *r.mutable_noised() = Wire(torch::full({1, 16, 2, 3, 4}, 3e38f));
                   },
                   "noised"});
  cases.push_back({"text -2e4",
                   [](auto& r) {
                     *r.mutable_text() = Wire(torch::full({1, 5, 48}, -2e4f));
                   },
                   "text"});
  // Over the default StepLimits (the model itself would take these).
  cases.push_back({"text over the server limit",
                   [](auto& r) {
                     *r.mutable_text() = Wire(torch::zeros({1, 1025, 48}));
                   },
                   "text"});
  cases.push_back({"grid over the server limit",
                   [](auto& r) {
                     *r.mutable_noised() = Wire(torch::zeros({1, 16, 2, 3, 129}));
                     *r.mutable_clean() = Wire(torch::zeros({1, 16, 1, 3, 129}));
                   },
                   "noised"});
  cases.push_back({"anchor over the server limit",
                   [](auto& r) {
                     *r.mutable_anchor() = Wire(torch::zeros({1, 16, 1, 3, 200}));
                   },
                   "anchor"});
  cases.push_back({"frames over the server limit",
                   [](auto& r) {
                     *r.mutable_noised() = Wire(torch::zeros({1, 16, 65, 1, 1}));
                     *r.mutable_anchor() = Wire(torch::zeros({1, 16, 1, 1, 1}));
                     *r.mutable_timesteps() = Wire(torch::rand({1, 1}));
                     r.set_frames_per_chunk(65);
                     r.clear_clean();
                   },
                   "noised"});
  return cases;
}

}  // namespace praxis::serve::fixtures
