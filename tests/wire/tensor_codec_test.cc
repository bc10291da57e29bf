#include "wire/tensor_codec.h"

#include <gtest/gtest.h>

namespace praxis::wire {
namespace {

TEST(TensorCodecTest, RoundTripsEveryWireDtypeBitExactly) {
  torch::manual_seed(0);
  const torch::Tensor f = torch::randn({2, 3, 4});
  for (v1::DType wire : {v1::FLOAT32, v1::BFLOAT16, v1::FLOAT16}) {
    absl::StatusOr<v1::Tensor> enc = EncodeTensor(f, wire);
    ASSERT_TRUE(enc.ok()) << enc.status();
    EXPECT_EQ(enc->dtype(), wire);
    absl::StatusOr<torch::Tensor> dec = DecodeTensor(*enc, "x");
    ASSERT_TRUE(dec.ok()) << dec.status();
    EXPECT_TRUE(torch::equal(*dec, f.to(dec->scalar_type()))) << wire;
  }
  const torch::Tensor i = torch::arange(10, torch::kInt64).view({2, 5});
  absl::StatusOr<v1::Tensor> enc = EncodeTensor(i, v1::BFLOAT16);
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(enc->dtype(), v1::INT64) << "int64 outputs keep their dtype";
  EXPECT_TRUE(torch::equal(*DecodeTensor(*enc, "x"), i));
}

TEST(TensorCodecTest, BytesAreLittleEndianRowMajor) {
  const torch::Tensor t = torch::tensor({1.0f, 2.0f}).view({1, 2}).t();  // non-contiguous
  const std::string bytes = *TensorBytes(t, v1::FLOAT32);
  ASSERT_EQ(bytes.size(), 8u);
  EXPECT_EQ(static_cast<uint8_t>(bytes[3]), 0x3f);  // 1.0f = 0x3f800000, little-endian
  EXPECT_EQ(static_cast<uint8_t>(bytes[7]), 0x40);  // 2.0f = 0x40000000
}

TEST(TensorCodecTest, RejectsMalformedTensorsNamingTheField) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  t.add_shape(2);
  t.add_shape(3);
  t.set_data(std::string(20, '\0'));
  absl::StatusOr<torch::Tensor> r = DecodeTensor(t, "noised");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("noised.data: expected 24 bytes"), std::string::npos)
      << r.status();
  t.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_NE(DecodeTensor(t, "text").status().message().find("text.dtype"), std::string::npos);
  t.set_dtype(v1::FLOAT32);
  t.set_shape(0, -2);
  EXPECT_NE(DecodeTensor(t, "anchor").status().message().find("anchor.shape"), std::string::npos);
  t.clear_shape();
  for (int i = 0; i < 9; ++i) t.add_shape(1);
  EXPECT_FALSE(DecodeTensor(t, "clean").ok());
  t.clear_shape();
  t.add_shape(int64_t{1} << 40);
  t.add_shape(int64_t{1} << 40);
  EXPECT_NE(DecodeTensor(t, "x").status().message().find("x.shape: expected"), std::string::npos);
  EXPECT_FALSE(EncodeTensor(torch::zeros({2}), v1::INT64).ok())
      << "float outputs need a float wire";
}

// Shapes whose byte count wraps modulo 2^64 (or hides behind a zero) once expected 0 bytes, and
// torch::empty then threw through validation.
TEST(TensorCodecTest, RefusesShapesWhoseByteCountOverflows) {
  const int64_t big = int64_t{1} << 62, half = int64_t{1} << 31, huge = int64_t{1} << 40;
  const std::vector<std::vector<int64_t>> shapes = {
      {big}, {half, half}, {big, 1, 1}, {0, huge, huge}, {INT64_MAX}, {3, INT64_MAX / 2}};
  for (const auto& shape : shapes) {
    v1::Tensor t;
    t.set_dtype(v1::FLOAT32);
    for (int64_t d : shape) t.add_shape(d);
    const absl::Status s = DecodeTensor(t, "noised").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << shape[0];
    EXPECT_NE(s.message().find("noised.shape: expected"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace praxis::wire
