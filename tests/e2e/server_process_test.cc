// praxis-server as a process, as the README's serve command starts it: the start-up line and the
// port file, health,
// a step, /metrics, and SIGTERM under load (nothing accepted is lost, exit status 0).

#include "tests/e2e/server_process.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/praxis_client.h"
#include "common/file_util.h"
#include "nlohmann/json.hpp"
#include "tests/server/malformed_requests.h"
#include "tests/server/metrics_text.h"

namespace praxis::serve {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

using fixtures::Connect;
using fixtures::ServerProcess;

TEST(ServerProcessTest, StartsOnTheEmbeddedModelAndServes) {
  ServerProcess p({});
  ASSERT_GT(p.pid(), 0) << "set PRAXIS_SERVER_BIN";
  ASSERT_TRUE(p.WaitServing()) << p.log();
  for (const char* part :
       {"model embedded:tiny", "device cpu", "dtype float32", "limits batch 8"}) {
    EXPECT_TRUE(absl::StrContains(p.start_line(), part)) << part << " in " << p.start_line();
  }
  // The port file (where the harness took the ports from) agrees with the human line.
  EXPECT_TRUE(absl::StrContains(p.start_line(), absl::StrCat("serving on 127.0.0.1:", p.port(),
                                                             " metrics ", p.metrics_port(), " ")))
      << p.start_line();
  const nlohmann::json port_file = nlohmann::json::parse(ReadFileToString(p.port_file()).value());
  EXPECT_EQ(port_file["pid"], p.pid()) << port_file;
  EXPECT_FALSE(PathExists(p.port_file() + ".tmp"));
  auto c = Connect(p.port());
  EXPECT_EQ(c->Health("", kTimeout).value(), grpc::health::v1::HealthCheckResponse::SERVING);
  const absl::StatusOr<client::StepReply> r = c->Step(fixtures::Valid(), kTimeout);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors.count("velocity"), 1u);
  const std::string metrics = fixtures::HttpGet(p.metrics_port(), "/metrics");
  EXPECT_EQ(fixtures::Sample(metrics, "praxis_requests_total", {{"code", "OK"}}), 1) << metrics;
  kill(p.pid(), SIGINT);
  EXPECT_EQ(p.WaitExit(), 0) << p.log();
}

TEST(ServerProcessTest, SigtermUnderLoadLosesNoAcceptedRequest) {
  // With the answer pipeline on whatever the cores: the drain must also flush the answers it holds.
  ServerProcess p({"--drain_seconds=30", "--max_queue_delay=20ms", "--answer_pipeline=on"});
  ASSERT_GT(p.pid(), 0) << "set PRAXIS_SERVER_BIN";
  ASSERT_TRUE(p.WaitServing()) << p.log();
  auto c = Connect(p.port());
  constexpr int kCallers = 12;
  std::atomic<int> ok_before{0};
  std::atomic<bool> signalled{false};
  std::vector<std::vector<absl::Status>> results(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      for (int n = 0; n < 500; ++n) {  // bounded; ends at the first refusal after the signal
        const absl::Status s = c->Step(fixtures::Valid(), kTimeout).status();
        results[i].push_back(s);
        if (s.ok() && !signalled) ++ok_before;
        if (!s.ok()) return;
      }
    });
  }
  for (int n = 0; n < 60000 && ok_before < 3 * kCallers; ++n) absl::SleepFor(absl::Milliseconds(1));
  signalled = true;
  kill(p.pid(), SIGTERM);
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(p.WaitExit(), 0) << p.log();
  EXPECT_TRUE(absl::StrContains(p.log(), "draining")) << p.log();
  EXPECT_TRUE(absl::StrContains(p.log(), "stopped")) << p.log();
  int ok = 0, refused = 0;
  for (const auto& caller : results) {
    for (const absl::Status& s : caller) {
      if (s.ok()) {
        ++ok;
        continue;
      }
      // Refused by the draining service (UNAVAILABLE), or, in the instant between gRPC's
      // shutdown and the client reading its GOAWAY, dropped by gRPC before reaching the service
      // (CANCELLED). The server's own count below shows that neither was an accepted step.
      EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
                  s.code() == absl::StatusCode::kCancelled)
          << s;
      EXPECT_FALSE(absl::StrContains(s.message(), "before this request ran")) << s;
      ++refused;
    }
  }
  EXPECT_GE(ok, 3 * kCallers);
  EXPECT_EQ(refused, kCallers);  // each caller stopped at its first refusal
  // Every step the service accepted was answered in full, and the client got each of them.
  EXPECT_TRUE(
      absl::StrContains(p.log(), absl::StrCat(" ", ok, " steps accepted, ", ok, " answered OK")))
      << "client saw " << ok << " OK; server said: " << p.log();
}

// TLS with a certificate made for this test: a TLS client gets through, a plaintext one does not.
TEST(ServerProcessTest, ServesTlsWithTheGivenCertificate) {
  char dir_template[] = "/tmp/praxis-tls-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  const std::string openssl = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext "
      "subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout ",
      key, " -out ", cert, " 2>/dev/null");
  ASSERT_EQ(std::system(openssl.c_str()), 0) << openssl;
  ServerProcess p({"--tls_cert=" + cert, "--tls_key=" + key});
  ASSERT_GT(p.pid(), 0) << "set PRAXIS_SERVER_BIN";
  ASSERT_TRUE(p.WaitServing()) << p.log();
  client::ClientOptions tls;
  tls.tls_ca_file = cert;
  tls.max_attempts = 1;
  auto secure = client::Client::Create(absl::StrCat("127.0.0.1:", p.port()), tls).value();
  const absl::StatusOr<client::StepReply> r = secure->Step(fixtures::Valid(), kTimeout);
  EXPECT_TRUE(r.ok()) << r.status();
  auto plain = Connect(p.port());
  EXPECT_EQ(plain->Step(fixtures::Valid(), absl::Seconds(10)).status().code(),
            absl::StatusCode::kUnavailable);
  kill(p.pid(), SIGTERM);
  EXPECT_EQ(p.WaitExit(), 0) << p.log();
  std::system(absl::StrCat("rm -rf ", dir).c_str());
}

}  // namespace
}  // namespace praxis::serve
