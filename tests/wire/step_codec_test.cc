#include "wire/step_codec.h"

#include <gtest/gtest.h>

#include "wire/layout_key.h"
#include "wire/synthetic.h"

namespace praxis::wire {
namespace {

constexpr StepDims kDims{.text_dim = 8, .latent_channels = 3};
constexpr StepGeometry kGeometry{
    .text_len = 4, .anchor_h = 2, .anchor_w = 3, .k = 2, .f = 2, .h = 2, .w = 3};

TEST(StepCodecTest, EveryInputIsATensorFieldOfStepRequest) {
  for (const InputField& input : kInputFields) {
    const auto* f = v1::StepRequest::descriptor()->FindFieldByName(input.name);
    ASSERT_NE(f, nullptr) << input.name;
    EXPECT_EQ(f->message_type(), v1::Tensor::descriptor()) << input.name;
  }
}

TEST(StepCodecTest, InputsRoundTripBitExactly) {
  const StepInputs in = SyntheticInputs(kDims, kGeometry, 2, /*seed=*/3);
  v1::StepRequest r;
  ASSERT_TRUE(EncodeInputTensors(in, v1::FLOAT32, &r).ok());
  StepInputs out;
  ASSERT_TRUE(DecodeInputTensors(r, &out).ok());
  for (const InputField& input : kInputFields) {
    EXPECT_TRUE(torch::equal(out.*input.tensor, in.*input.tensor)) << input.name;
  }
}

TEST(StepCodecTest, AbsentCleanStaysUndefinedAndAMissingRequiredTensorIsNamed) {
  StepGeometry one_chunk = kGeometry;
  one_chunk.k = 1;
  const StepInputs in = SyntheticInputs(kDims, one_chunk, 1, /*seed=*/3);
  ASSERT_FALSE(in.clean.defined());
  v1::StepRequest r;
  ASSERT_TRUE(EncodeInputTensors(in, v1::BFLOAT16, &r).ok());
  EXPECT_FALSE(r.has_clean());
  StepInputs out;
  ASSERT_TRUE(DecodeInputTensors(r, &out).ok());
  EXPECT_FALSE(out.clean.defined());
  EXPECT_EQ(out.text.scalar_type(), torch::kBFloat16);

  r.clear_noised();
  StepInputs fresh;
  const absl::Status missing = DecodeInputTensors(r, &fresh);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(missing.message(), "noised: expected a tensor, got none");
  // A tensor the caller holds stands in for an absent one (a Session's kept text).
  const torch::Tensor kept = out.noised;
  ASSERT_TRUE(DecodeInputTensors(r, &out).ok());
  EXPECT_TRUE(out.noised.is_same(kept));
}

TEST(StepCodecTest, LayoutKeyAndLayoutTextAgree) {
  const StepGeometry g = *ParseLayout("4,2,3,2,2", "--layout");
  EXPECT_EQ(LayoutKey(g, true, {}), LayoutKey(kGeometry, true, {}));
  EXPECT_EQ(LayoutKey(SyntheticInputs(kDims, g, 1, 0)), "L4_a2x3_K2_F2_g2x3_dec_rs0,0,0,0");
  EXPECT_EQ(ParseLayout("4,2,3,0,2", "--mix").status().message(),
            "--mix: expected five positive integers text_len,h,w,K,F, got \"4,2,3,0,2\"");
  EXPECT_EQ(ParseRopeShifts("1,2,x,4", "--rope_shifts").status().message(),
            "--rope_shifts: 'x' is not an integer");
}

}  // namespace
}  // namespace praxis::wire
