#include "wire/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tests/model/promptly.h"

namespace praxis::wire {
namespace {

using model::RunPromptly;
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
  void ExpectRoundTrip(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                       LoadMode mode);
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
  for (LoadMode mode : {LoadMode::kCopy, LoadMode::kMmap}) {
    SCOPED_TRACE(mode == LoadMode::kCopy ? "copy" : "mmap");
    ExpectRoundTrip(tensors, mode);
  }
}

void SafetensorsTest::ExpectRoundTrip(
    const std::vector<std::pair<std::string, torch::Tensor>>& tensors, LoadMode mode) {
  auto f = SafetensorsFile::Open(path_, mode);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->mode(), mode);
  EXPECT_EQ((*f)->names(), std::vector<std::string>({"a.bf16", "b.bool", "e.empty", "i.i64",
                                                     "m.f16", "t.transposed", "z.f32"}));
  EXPECT_EQ((*f)->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"seed", "0"}}));
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, ReadFileToString(path_)->data(), 8);
  for (const auto& [name, t] : tensors) {
    absl::StatusOr<torch::Tensor> got = (*f)->Get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(*got, t)) << name;
    // Names sort the data, so after the 3-byte bool the rest is misaligned and copied.
    const uint64_t offset = 8 + header_bytes + (*f)->info(name)->begin;
    if (t.numel() > 0) {
      const bool view = mode == LoadMode::kMmap && offset % t.element_size() == 0;
      EXPECT_EQ((*f)->IsViewOf(*got), view) << name;
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

TEST_F(SafetensorsTest, UnwritablePathIsNamedWithTheSystemsReason) {
  const std::string dir = testing::TempDir();
  absl::Status s = WriteSafetensors(dir, {{"x", torch::ones({1})}});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir));
  EXPECT_THAT(s.message(), HasSubstr(std::strerror(EISDIR)));
}

TEST_F(SafetensorsTest, ViewsOutliveTheFile) {
  ASSERT_TRUE(WriteSafetensors(path_, {{"x", torch::arange(4, torch::kFloat32)}}).ok());
  torch::Tensor x;
  {
    auto f = SafetensorsFile::Open(path_, LoadMode::kMmap);
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
  auto f = SafetensorsFile::Open(path_, LoadMode::kMmap);
  ASSERT_TRUE(f.ok()) << f.status();
  torch::Tensor w = *(*f)->Get("w");
  EXPECT_EQ(w.item<float>(), 1.0f);
  EXPECT_FALSE((*f)->IsViewOf(w));
}

// A header whose tensors are "t0".."t<n-1>", each F32 [4], at the given byte offsets.
std::string HeaderWithOffsets(const std::vector<std::pair<uint64_t, uint64_t>>& offsets) {
  std::string h = "{";
  for (size_t i = 0; i < offsets.size(); ++i) {
    absl::StrAppend(&h, i ? "," : "", "\"t", i, "\":{\"dtype\":\"F32\",\"shape\":[4],",
                    "\"data_offsets\":[", offsets[i].first, ",", offsets[i].second, "]}");
  }
  return h + "}";
}

TEST_F(SafetensorsTest, AliasedTensorsAreRefused) {
  // 86 tensors over the same 16 bytes: accepted and served before, one write seen in all of them.
  WriteRaw(HeaderWithOffsets(std::vector<std::pair<uint64_t, uint64_t>>(86, {0, 16})),
           std::string(16, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr(path_ + ": tensors 't0' [0, 16) and 't1' [0, 16) overlap"));
  WriteRaw(HeaderWithOffsets({{0, 16}, {8, 24}}), std::string(24, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensors 't0' [0, 16) and 't1' [8, 24) overlap"));
}

TEST_F(SafetensorsTest, GapsAndTrailingBytesAreRefused) {
  WriteRaw(HeaderWithOffsets({{0, 16}, {24, 40}}), std::string(40, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr(path_ + ": bytes [16, 24) of the data region belong to no "
                                             "tensor (before 't1')"));
  WriteRaw(HeaderWithOffsets({{0, 16}}), std::string(24, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr(path_ + ": 8 trailing bytes: the data region has 24 bytes, "
                                             "its tensors end at 16"));
  // Out of order in the header is fine: the layout is checked in byte order.
  WriteRaw(HeaderWithOffsets({{16, 32}, {0, 16}}), std::string(32, '\0'));
  EXPECT_TRUE(SafetensorsFile::Open(path_).ok());
}

TEST_F(SafetensorsTest, OffsetsOutOfRangeOrOverflowingAreRefused) {
  WriteRaw(HeaderWithOffsets({{0, uint64_t{1} << 40}}), std::string(16, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr(path_ + ": tensor 't0': data_offsets [0, 1099511627776) "
                                             "exceed the 16-byte data region (file truncated?)"));
  WriteRaw(HeaderWithOffsets({{16, 0}}), std::string(16, '\0'));
  EXPECT_THAT(OpenError(), HasSubstr("tensor 't0': data_offsets [16, 0) are reversed"));
  WriteRaw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,18446744073709551616]}})", "");
  EXPECT_THAT(OpenError(), HasSubstr("tensor 'w': 'data_offsets' must be two non-negative"));
  // 2^62 * 2^62 * 4 bytes wraps to 0 in 64 bits; [0, 0) must not match it.
  WriteRaw(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],)"
           R"("data_offsets":[0,0]}})",
           "");
  EXPECT_THAT(OpenError(), HasSubstr("tensor 'w': data_offsets [0, 0) hold 0 bytes, but dtype F32 "
                                     "shape [4611686018427387904, 4611686018427387904] needs "
                                     "more than 2^63"));
}

TEST_F(SafetensorsTest, HeaderLengthIsBounded) {
  std::string length(8, '\0');
  const uint64_t n = kMaxSafetensorsHeaderBytes + 1;
  std::memcpy(length.data(), &n, 8);
  absl::StatusOr<uint64_t> got = ParseSafetensorsHeaderLength(length, uint64_t{1} << 40);
  EXPECT_EQ(got.status().message(), "header length 33554433 exceeds the limit of 33554432 bytes");
  const uint64_t at_limit = kMaxSafetensorsHeaderBytes;
  std::memcpy(length.data(), &at_limit, 8);
  EXPECT_EQ(*ParseSafetensorsHeaderLength(length, at_limit + 8), at_limit);
  EXPECT_EQ(ParseSafetensorsHeaderLength(length, at_limit + 7).status().message(),
            "header length 33554432 exceeds the file (33554439 bytes)");
}

TEST_F(SafetensorsTest, ParsesAHeaderFromBytesAlone) {
  ASSERT_TRUE(WriteSafetensors(path_, {{"x", torch::ones({3})}, {"y", torch::zeros({2, 2})}}).ok());
  const std::string bytes = *ReadFileToString(path_);
  absl::StatusOr<SafetensorsHeader> h = ParseSafetensorsHeader(bytes);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->entries.size(), 2u);
  EXPECT_EQ(h->entries.at("y").shape, std::vector<int64_t>({2, 2}));
  EXPECT_EQ(h->data_start + h->entries.at("y").end, bytes.size());
  EXPECT_THAT(ParseSafetensorsHeader(bytes.substr(0, bytes.size() - 1)).status().message(),
              HasSubstr("tensor 'y': data_offsets [12, 28) exceed the 27-byte data region"));
  EXPECT_THAT(ParseSafetensorsHeader("abc").status().message(), HasSubstr("too short"));
}

TEST_F(SafetensorsTest, OnlyRegularFilesAreOpened) {
  const std::string fifo = path_ + ".fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status s = RunPromptly([&] { return SafetensorsFile::Open(fifo).status(); }, fifo);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), fifo + ": not a regular file (a FIFO)");
  ::unlink(fifo.c_str());
  EXPECT_EQ(SafetensorsFile::Open(testing::TempDir()).status().message(),
            testing::TempDir() + ": not a regular file (a directory)");
  EXPECT_EQ(SafetensorsFile::Open("/dev/zero", LoadMode::kMmap).status().message(),
            "/dev/zero: not a regular file (a character device)");
  EXPECT_EQ(SafetensorsFile::Open(path_ + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, CopiedTensorsSurviveTruncation) {
  const torch::Tensor x = torch::arange(1000, torch::kFloat32);
  ASSERT_TRUE(WriteSafetensors(path_, {{"x", x}, {"y", x + 1}}).ok());
  auto f = SafetensorsFile::Open(path_);  // kCopy, the default
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->mapping().first, nullptr);
  const torch::Tensor got = *(*f)->Get("x");
  ASSERT_EQ(::truncate(path_.c_str(), 100), 0);
  // A view of a mapping would raise SIGBUS here; the copy is memory of its own.
  EXPECT_TRUE(torch::equal(got, x));
  EXPECT_FALSE((*f)->IsViewOf(got));
  // A tensor read after the truncation is an error naming the file and tensor, not a crash.
  absl::StatusOr<torch::Tensor> late = (*f)->Get("y");
  EXPECT_EQ(late.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(late.status().message(), HasSubstr(path_ + ": tensor 'y': the file ended at byte"));
}

TEST(LoadModeTest, Parses) {
  EXPECT_EQ(*ParseLoadMode("copy"), LoadMode::kCopy);
  EXPECT_EQ(*ParseLoadMode("mmap"), LoadMode::kMmap);
  EXPECT_EQ(ParseLoadMode("map").status().message(), "--load: expected copy or mmap, got \"map\"");
}

}  // namespace
}  // namespace praxis::wire
