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

TEST(StepRequestTest, AValidRequestOverItsComputeCostIsRefusedBeforeQueueing) {
  StepLimits limits;
  absl::StatusOr<DecodedStep> s = DecodeStepRequest(Valid(), Tiny(), limits);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->cost.gflop(), 0);
  EXPECT_EQ(s->cost.encoder_tokens, 57);
  limits.max_request_gflop = s->cost.gflop() / 2;
  const absl::Status refused = DecodeStepRequest(Valid(), Tiny(), limits).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max_request_cost"), std::string::npos) << refused;
}

TEST(StepRequestTest, DenseAttentionRefusesLayoutsWhoseMaskIsTooLarge) {
  StepLimits limits;
  limits.dense_attention = true;
  limits.max_dense_mask_bytes = 57 * 57 - 1;  // the encoder's [57, 57] mask does not fit
  const absl::Status s = DecodeStepRequest(Valid(), Tiny(), limits).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--max_dense_mask_bytes"), std::string::npos) << s;
  limits.dense_attention = false;
  EXPECT_TRUE(DecodeStepRequest(Valid(), Tiny(), limits).ok()) << "sparse attention has no [T, T]";
}

// velocity [1, 16, 2, 3, 4] and two taps [1, 57, 64] of float32; bf16 halves both.
TEST(StepRequestTest, TheAnswerSizeIsKnownBeforeQueueingAndBounded) {
  StepLimits limits;
  absl::StatusOr<DecodedStep> s = DecodeStepRequest(Valid(), Tiny(), limits);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->outputs.response_bytes, (16 * 2 * 3 * 4 + 2 * 57 * 64) * 4);
  v1::StepRequest bf = Valid();
  bf.set_wire_dtype(v1::BFLOAT16);
  EXPECT_EQ(DecodeStepRequest(bf, Tiny(), limits)->outputs.response_bytes,
            (16 * 2 * 3 * 4 + 2 * 57 * 64) * 2);
  limits.max_response_bytes = s->outputs.response_bytes - 1;
  const absl::Status refused = DecodeStepRequest(Valid(), Tiny(), limits).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max_response_bytes"), std::string::npos) << refused;
}

// The derived --max_message_bytes must admit every request the other limits admit: a request of
// the most rows x tokens the cost allows, at the widest input, fits.
TEST(StepRequestTest, LargestLegalStepBoundsTheValidRequest) {
  const model::BackboneConfig c = Tiny();
  StepLimits limits;
  const MessageBounds b = LargestLegalStep(c, limits);
  const v1::StepRequest r = Valid();
  EXPECT_GT(b.request_bytes, static_cast<int64_t>(r.ByteSizeLong()));
  EXPECT_GT(b.response_bytes, DecodeStepRequest(r, c, limits)->outputs.response_bytes);
  limits.max_request_gflop /= 10;
  EXPECT_LT(LargestLegalStep(c, limits).request_bytes, b.request_bytes) << "cost caps the size";
}

}  // namespace
}  // namespace praxis::serve
