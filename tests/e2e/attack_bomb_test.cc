// Attacks by cost (attack_fixture.h says what every attack test asserts): valid requests within
// every shape limit whose compute, or whose dense attention mask, is refused before it is run.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"
#include "tests/e2e/attack_fixture.h"

namespace praxis::serve::attack {
namespace {

// Within every shape limit (grid 32 x 32, 16 frames, 65,540 decoder tokens of one full-attention
// chunk): hundreds of GFLOP, minutes of the only worker before admission counted the cost.
v1::StepRequest ComputeBomb() { return LayoutRequest(8, 32, 32, 2, 8, true, {"velocity"}); }

// 16,388 decoder tokens: a dense [T, T] mask of 256 MiB, over --max_dense_mask_bytes (64 MiB).
v1::StepRequest DenseBomb() { return LayoutRequest(8, 16, 16, 1, 16, true, {"velocity"}); }

TEST(AttackTest, ComputeBombIsRefusedAtOnceAndOthersAreServed) {
  auto p = Start({"--drain_seconds=5"});
  ASSERT_GT(p->port(), 0);
  auto attacker = fixtures::Connect(p->port());
  const v1::StepRequest bomb = ComputeBomb();
  const int n = Repeats();
  const int64_t before = p->RssBytes();
  absl::Duration slowest;
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    ExpectRefused(attacker->Step(bomb, kCall).status(), absl::StatusCode::kResourceExhausted,
                  "max_request_cost");
    slowest = std::max(slowest, absl::Now() - start);
    if (HasFailure()) break;
  }
  std::printf("[bomb] %d compute bombs of %zu bytes, slowest refusal %s\n", n, bomb.ByteSizeLong(),
              absl::FormatDuration(slowest).c_str());
  EXPECT_LT(slowest, absl::Milliseconds(500));
  ExpectServed(p->port(), absl::Seconds(1));
  const int64_t after = p->RssBytes();
  ReportRss("compute bomb (Step)", before, after, n);
  EXPECT_LE(after - before, kRepeatGrowthBytes);
  ExpectCleanExit(*p, absl::Seconds(5), "after compute bombs");
}

TEST(AttackTest, DenseMaskBombIsRefusedNamingTheLimit) {
  auto p = Start({"--drain_seconds=5", "--attention=dense"});
  ASSERT_GT(p->port(), 0);
  auto attacker = fixtures::Connect(p->port());
  const v1::StepRequest bomb = DenseBomb();
  const int n = Repeats();
  const int64_t before = p->RssBytes();
  for (int i = 0; i < n; ++i) {
    const absl::Time start = absl::Now();
    ExpectRefused(attacker->Step(bomb, kCall).status(), absl::StatusCode::kResourceExhausted,
                  "max_dense_mask_bytes");
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
    if (HasFailure()) break;
  }
  ExpectServed(p->port(), absl::Seconds(1));
  const int64_t after = p->RssBytes();
  ReportRss("dense mask bomb (Step)", before, after, n);
  EXPECT_LE(after - before, kRepeatGrowthBytes);
  ExpectCleanExit(*p, absl::Seconds(5), "after dense mask bombs");
}

}  // namespace
}  // namespace praxis::serve::attack
