#include "server/step_request.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/server/malformed_requests.h"

namespace praxis::serve {
namespace {

using fixtures::Malformed;
using fixtures::MalformedCases;
using fixtures::Valid;

model::BackboneConfig Tiny() {
  return *model::LoadConfig(std::string(PRAXIS_SOURCE_DIR) + "/configs/tiny.json");
}

TEST(StepRequestTest, ValidRequestDecodes) {
  absl::StatusOr<DecodedStep> s = DecodeStepRequest(Valid(), Tiny());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->inputs.noised.sizes(), (std::vector<int64_t>{1, 16, 2, 3, 4}));
  EXPECT_EQ(s->outputs.taps, (std::vector<int>{0, 1}));
  EXPECT_EQ(s->outputs.wire_dtype, v1::FLOAT32);
}

TEST(StepRequestTest, EachMalformedRequestIsRefusedNamingTheField) {
  const std::vector<Malformed> cases = MalformedCases();
  ASSERT_GE(cases.size(), 25u);
  const model::BackboneConfig config = Tiny();
  for (const Malformed& c : cases) {
    v1::StepRequest r = Valid();
    c.mutate(r);
    absl::StatusOr<DecodedStep> s = DecodeStepRequest(r, config);
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(s.status().message().substr(0, c.field.size()), c.field)
        << c.name << ": " << s.status().message();
  }
}

TEST(StepRequestTest, ServingLimitsAreCheckedAfterTheModelsOwn) {
  StepLimits limits;
  limits.max_tokens = 40;  // the valid request's encoder holds 4 + 12 + 5 + 24 + 12 = 57 tokens
  absl::StatusOr<DecodedStep> s = DecodeStepRequest(Valid(), Tiny(), limits);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(), "noised: expected encoder tokens <= 40 (server limit), got 57");
}

}  // namespace
}  // namespace praxis::serve
