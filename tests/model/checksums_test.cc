#include "model/checksums.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "tests/model/checkpoint_fixture.h"

namespace praxis::model {
namespace {

using ::testing::HasSubstr;

// SHA256SUMS as the sha256sum tool writes it, for config.json and model.safetensors.
class ChecksumTest : public CheckpointTest {
 protected:
  void WriteSums(const std::string& extra = "") {
    const std::string cmd =
        absl::StrCat("cd '", dir_, "' && sha256sum config.json model.safetensors > SHA256SUMS");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    if (!extra.empty()) WriteFile(sums(), ReadFile(sums()) + extra);
  }
  std::string sums() const { return JoinPath(dir_, "SHA256SUMS"); }
};

TEST_F(ChecksumTest, Sha256OfAKnownInput) {
  const std::string path = JoinPath(dir_, "abc");
  WriteFile(path, "abc");  // FIPS 180-2, appendix B.1
  EXPECT_EQ(*Sha256File(path), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(ChecksumTest, MatchingSumsLoad) {
  Write();
  WriteSums();
  absl::StatusOr<Checkpoint> c = Load();
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameValues(*c, tensors, torch::kFloat32);
}

TEST_F(ChecksumTest, AChangedByteIsRefusedNamingTheFile) {
  Write();
  WriteSums();
  std::string bytes = ReadFile(weights());
  bytes.back() ^= 1;  // still a valid safetensors file: only the hash can tell
  WriteFile(weights(), bytes);
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(weights() + ": SHA-256 "));
  EXPECT_THAT(c.status().message(), HasSubstr(" does not match SHA256SUMS ("));
}

TEST_F(ChecksumTest, AListedFileThatIsMissingIsNamed) {
  Write();
  WriteSums(std::string(64, '0') + "  model-00002-of-00002.safetensors\n");
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(),
              HasSubstr(JoinPath(dir_, "model-00002-of-00002.safetensors") + ": cannot open"));
}

TEST_F(ChecksumTest, EveryFileReadMustBeListed) {
  Write();
  WriteSums();
  const std::string text = ReadFile(sums());
  WriteFile(sums(), text.substr(0, text.find('\n') + 1));  // config.json only
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(), weights() + ": not listed in SHA256SUMS, which lists 1 files");
}

TEST_F(ChecksumTest, MalformedSumsNameTheLine) {
  Write();
  WriteSums("not a checksum line\n");
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().message(),
            JoinPath(dir_, "SHA256SUMS:3: expected '<64 hex digits>  <file>'"));
}

TEST(ParseSha256SumsTest, FormatsOfSha256sum) {
  const std::string a(64, 'a'), b(64, 'B');
  absl::StatusOr<std::map<std::string, std::string>> got =
      ParseSha256Sums(a + "  ./config.json\n" + b + " *model.safetensors\r\n\n");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::map<std::string, std::string>{
                      {"config.json", a}, {"model.safetensors", std::string(64, 'b')}}));
  EXPECT_EQ(ParseSha256Sums(a + "  ../etc/passwd").status().message(),
            "SHA256SUMS:1: a file name may not contain '..'");
  EXPECT_EQ(ParseSha256Sums(a + "  /etc/passwd").status().message(),
            "SHA256SUMS:1: expected a file name relative to the checkpoint directory");
  EXPECT_EQ(ParseSha256Sums(a + "  x\n" + b + "  ./x\n").status().message(),
            "SHA256SUMS:2: 'x' is listed twice");
  EXPECT_EQ(ParseSha256Sums(a.substr(1) + "  x").status().message(),
            "SHA256SUMS:1: expected '<64 hex digits>  <file>'");
}

}  // namespace
}  // namespace praxis::model
