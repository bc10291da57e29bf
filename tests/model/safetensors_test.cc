#include "model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "common/file_util.h"

namespace praxis::model {
namespace {

using ::testing::HasSubstr;

// A file under the test temp dir, removed afterwards. (POSIX, see common/file_util.h.)
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = JoinPath(testing::TempDir(), "safetensors_test_XXXXXX");
    const int fd = mkstemp(templ.data());
    ASSERT_GE(fd, 0);
    ::close(fd);
    path_ = templ;
  }
  void TearDown() override { ::unlink(path_.c_str()); }

  // Writes an 8-byte length, `header` and `data` verbatim.
  void WriteRaw(const std::string& header, const std::string& data) {
    const uint64_t n = header.size();
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &n, 8);
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << bytes << header << data;
  }
  std::string OpenError() {
    auto f = SafetensorsFile::Open(path_);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
    return std::string(f.status().message());
  }

  std::string path_;
};

TEST_F(SafetensorsTest, RoundTripsDtypesShapesAndMetadata) {
  const std::vector<std::pair<std::string, torch::Tensor>> tensors = {
      {"z.f32", torch::randn({3, 4})},
      {"a.bf16", torch::randn({2, 5}).to(torch::kBFloat16)},
      {"m.f16", torch::randn({7}).to(torch::kFloat16)},
      {"i.i64", torch::arange(6, torch::kInt64).view({2, 3})},
      {"b.bool", torch::tensor({true, false, true})},
      {"e.empty", torch::zeros({0, 3})},
      {"t.transposed", torch::randn({4, 3}).t()},  // written contiguous
  };
  ASSERT_TRUE(WriteSafetensors(path_, tensors, {{"seed", "0"}, {"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->names(), std::vector<std::string>({"a.bf16", "b.bool", "e.empty", "i.i64",
                                                     "m.f16", "t.transposed", "z.f32"}));
  EXPECT_EQ((*f)->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"seed", "0"}}));
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, (*f)->mapping().first, 8);
  for (const auto& [name, t] : tensors) {
    absl::StatusOr<torch::Tensor> got = (*f)->Get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(*got, t)) << name;
    // Names sort the data, so after the 3-byte bool the rest is misaligned and copied.
    const uint64_t offset = 8 + header_bytes + (*f)->info(name)->begin;
    if (t.numel() > 0) {
      EXPECT_EQ((*f)->IsViewOf(*got), offset % t.element_size() == 0) << name;
    }
  }
  EXPECT_EQ((*f)->Get("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, WriterIsDeterministic) {
  const std::vector<std::pair<std::string, torch::Tensor>> a = {{"y", torch::ones({2})},
                                                                {"x", torch::zeros({3})}};
  const std::vector<std::pair<std::string, torch::Tensor>> b = {a[1], a[0]};  // order given
  ASSERT_TRUE(WriteSafetensors(path_, a, {{"k", "v"}}).ok());
  const std::string first = *ReadFileToString(path_);
  ASSERT_TRUE(WriteSafetensors(path_, b, {{"k", "v"}}).ok());
  EXPECT_EQ(*ReadFileToString(path_), first);
  uint64_t n = 0;
  std::memcpy(&n, first.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(first.substr(8, 20), "{\"__metadata__\":{\"k\"");
}

TEST_F(SafetensorsTest, DuplicateNameIsRejected) {
  absl::Status s = WriteSafetensors(path_, {{"x", torch::ones({1})}, {"x", torch::ones({1})}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'x'"));
}

TEST_F(SafetensorsTest, ViewsOutliveTheFile) {
  ASSERT_TRUE(WriteSafetensors(path_, {{"x", torch::arange(4, torch::kFloat32)}}).ok());
  torch::Tensor x;
  {
    auto f = SafetensorsFile::Open(path_);
    ASSERT_TRUE(f.ok());
    x = *(*f)->Get("x");
  }
  EXPECT_TRUE(torch::equal(x, torch::arange(4, torch::kFloat32)));
}

TEST_F(SafetensorsTest, ByteRangeNotMatchingShapeNamesTensor) {
  WriteRaw(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", std::string(16, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr(path_ + ": tensor 'w': data_offsets [0, 12) hold 12 bytes, "
                                             "but dtype F32 shape [2, 2] needs 16"));
}

TEST_F(SafetensorsTest, UnknownDtypeAndMalformedEntriesNameTensor) {
  WriteRaw(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor 'w': unsupported dtype \"C64\""));
  WriteRaw(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", std::string(4, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor 'w': 'shape'"));
  WriteRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", std::string(4, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor 'w': 'data_offsets'"));
  WriteRaw(R"({"__metadata__":{"k":1}})", "");
  EXPECT_THAT(OpenError(), HasSubstr("'__metadata__'"));
}

TEST_F(SafetensorsTest, FileShorterThanTheLengthField) {
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << "abc";
  EXPECT_THAT(OpenError(), HasSubstr("too short"));
}

TEST_F(SafetensorsTest, UnalignedDataIsCopied) {
  // A 7-byte-long header puts the data at offset 15: not float-aligned, so Get copies.
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} )";
  ASSERT_EQ((8 + header.size()) % 4, 3u);
  const float one = 1.0f;
  WriteRaw(header, std::string(reinterpret_cast<const char*>(&one), 4));
  auto f = SafetensorsFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status();
  torch::Tensor w = *(*f)->Get("w");
  EXPECT_EQ(w.item<float>(), 1.0f);
  EXPECT_FALSE((*f)->IsViewOf(w));
}

}  // namespace
}  // namespace praxis::model
