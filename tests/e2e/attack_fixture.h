#pragma once

// Issue 12's attack tests (tests/e2e/attack_*_test.cc, one executable): praxis-server as a process
// (PRAXIS_SERVER_BIN), attacked over loopback as an unauthenticated client would. Each attack must
// be answered with its documented status while another client is still served, the server's
// resident memory must stay within a stated bound, and SIGTERM must still end it with exit status 0
// within the drain grace plus one second. This header holds what the attack families share.
//
// PRAXIS_ATTACK_REPEATS (default 50) sets how many hostile requests of each kind are sent for the
// memory figures; every test prints "[rss] kind: before ... after ... requests N" lines, so
//   PRAXIS_ATTACK_REPEATS=1000 ctest --test-dir build -R Attack -V | grep '\[rss\]'
// gives the table of the issue. PRAXIS_TINY_DIR names the tiny checkpoint (make_tiny_goldens).

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"
#include "client/request_builder.h"
#include "model/config.h"
#include "model/masks.h"
#include "model/model_loader.h"
#include "tests/e2e/server_process.h"
#include "tests/server/malformed_requests.h"
#include "wire/synthetic.h"

namespace praxis::serve::attack {

using fixtures::ServerProcess;

// The deadline of every call the tests make.
inline constexpr absl::Duration kCall = absl::Seconds(30);
inline constexpr int64_t kMiB = int64_t{1} << 20;
// Growth of the resident set allowed over a run of hostile requests of one kind: allocator
// arenas and gRPC's buffers settle within it; the bugs of issue 12 grew it by hundreds of MiB.
inline constexpr int64_t kRepeatGrowthBytes = 64 * kMiB;

// Hostile requests of each kind: PRAXIS_ATTACK_REPEATS, or 50 if unset or not a positive integer.
inline int Repeats() {
  int n = 50;
  const char* env = std::getenv("PRAXIS_ATTACK_REPEATS");
  if (env != nullptr && (!absl::SimpleAtoi(env, &n) || n < 1)) n = 50;
  return n;
}

// `bytes` in MiB, for the printed figures.
inline double MiB(int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

// One line of the RSS table.
inline void ReportRss(const std::string& kind, int64_t before, int64_t after, int count) {
  std::printf("[rss] %-34s before %7.1f MiB  after %7.1f MiB  (%+6.1f MiB)  requests %d\n",
              kind.c_str(), MiB(before), MiB(after), MiB(after - before), count);
  std::fflush(stdout);
}

// The tiny model's config (configs/tiny.json, compiled in), parsed once.
inline const model::BackboneConfig& TinyConfig() {
  static const auto* config =
      new model::BackboneConfig(model::ParseConfig(model::kEmbeddedTinyConfig).value());
  return *config;
}

// A valid request of `layout` (anchor grid = noised grid) asking for `outputs`.
inline v1::StepRequest LayoutRequest(int64_t text_len, int64_t h, int64_t w, int64_t k, int64_t f,
                                     bool decode, std::vector<std::string> outputs) {
  const wire::StepGeometry layout{
      .text_len = text_len, .anchor_h = h, .anchor_w = w, .k = k, .f = f, .h = h, .w = w};
  model::StepInputs in = wire::SyntheticInputs(TinyConfig().step_dims(), layout, 1, /*seed=*/7);
  in.decode = decode;
  client::RequestOptions o;
  o.outputs = std::move(outputs);
  return client::MakeStepRequest(in, o).value();
}

// A server started with `flags`, serving; its log is printed if the test fails.
inline std::unique_ptr<ServerProcess> Start(std::vector<std::string> flags) {
  auto p = std::make_unique<ServerProcess>(std::move(flags));
  EXPECT_GT(p->pid(), 0) << "set PRAXIS_SERVER_BIN";
  if (p->pid() > 0) {
    EXPECT_TRUE(p->WaitServing()) << p->log();
  }
  return p;
}

// A client on a connection of its own (not shared with the attacker's).
inline std::unique_ptr<client::Client> Bystander(int port) {
  client::ClientOptions o;
  o.max_attempts = 1;
  o.own_connection = true;
  return client::Client::Create(absl::StrCat("127.0.0.1:", port), o).value();
}

// Another client's valid step is answered OK within `within`.
inline void ExpectServed(int port, absl::Duration within = absl::Seconds(5)) {
  const absl::Time start = absl::Now();
  const absl::StatusOr<client::StepReply> r = Bystander(port)->Step(fixtures::Valid(), kCall);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) {
    EXPECT_EQ(r->tensors.count("velocity"), 1u);
  }
  EXPECT_LE(absl::Now() - start, within);
}

// `s` is refused with `code`, its message naming `named` (a field, flag or limit).
inline void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& named) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), named)) << named << " in " << s;
}

// SIGTERM, then exit status 0 within `grace` + 1 s; prints and returns the time it took.
inline absl::Duration ExpectCleanExit(ServerProcess& p, absl::Duration grace,
                                      const std::string& what) {
  const absl::Time start = absl::Now();
  kill(p.pid(), SIGTERM);
  const int status = p.WaitExitWithin(grace + absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  std::printf("[sigterm] %s: exit %d after %s (grace %s)\n", what.c_str(), status,
              absl::FormatDuration(took).c_str(), absl::FormatDuration(grace).c_str());
  for (absl::string_view line : absl::StrSplit(p.log(), '\n')) {
    if (absl::StrContains(line, "stopped after")) std::printf("  %s\n", std::string(line).c_str());
  }
  std::fflush(stdout);
  EXPECT_EQ(status, 0) << p.log();
  EXPECT_LE(took, grace + absl::Seconds(1)) << p.log();
  return took;
}

}  // namespace praxis::serve::attack
