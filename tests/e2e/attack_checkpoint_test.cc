// An attack on the checkpoint (attack_fixture.h says what every attack test asserts): its weights
// file truncated while the server that loaded it serves.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"
#include "tests/e2e/attack_fixture.h"
#include "tests/server/malformed_requests.h"

namespace praxis::serve::attack {
namespace {

// The size of the file at `path` in bytes; -1 if it cannot be read.
int64_t FileSize(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// --load=copy (the default) reads the weights into memory: truncating the checkpoint's file while
// serving must not matter (with --load=mmap it would be SIGBUS).
TEST(AttackTest, TruncatingACopiedCheckpointWhileServing) {
  const char* tiny = std::getenv("PRAXIS_TINY_DIR");
  if (tiny == nullptr) GTEST_SKIP() << "PRAXIS_TINY_DIR unset (make_tiny_goldens)";
  // Shell commands rather than std::filesystem: libtorch exports an incompatible copy of it.
  char dir_template[] = "/tmp/praxis-attack-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = absl::StrCat(dir_template, "/model");
  ASSERT_EQ(std::system(absl::StrCat("cp -r '", tiny, "/model' '", dir, "'").c_str()), 0);
  const std::string weights = dir + "/model.safetensors";
  ASSERT_GT(FileSize(weights), 0);
  auto p = Start({"--checkpoint=" + dir, "--drain_seconds=5"});
  ASSERT_GT(p->port(), 0);
  ExpectServed(p->port());
  ASSERT_EQ(truncate(weights.c_str(), 0), 0);
  ASSERT_EQ(FileSize(weights), 0);
  auto c = fixtures::Connect(p->port());
  const int n = Repeats();
  const int64_t before = p->RssBytes();
  for (int i = 0; i < n; ++i) {
    const absl::StatusOr<client::StepReply> r = c->Step(fixtures::Valid(), kCall);
    ASSERT_TRUE(r.ok()) << "step " << i << " after truncation: " << r.status() << "\n" << p->log();
  }
  ExpectServed(p->port());
  ReportRss("valid steps, checkpoint truncated", before, p->RssBytes(), n);
  ExpectCleanExit(*p, absl::Seconds(5), "after the checkpoint was truncated");
  std::system(absl::StrCat("rm -rf '", dir_template, "'").c_str());
}

}  // namespace
}  // namespace praxis::serve::attack
