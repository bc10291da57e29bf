// Attacks by malformed requests (attack_fixture.h says what every attack test asserts): a list of
// duplicate taps, and tensor shapes whose sizes overflow, on Step and on a Session.

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"
#include "tests/e2e/attack_fixture.h"
#include "tests/server/malformed_requests.h"

namespace praxis::serve::attack {
namespace {

// tap 0 listed 54,000 times: a 58 KiB request that once made 54,000 copies of the tap.
v1::StepRequest DuplicateTaps() {
  v1::StepRequest r = fixtures::Valid();
  r.mutable_outputs()->set_all_taps(false);
  for (int i = 0; i < 54000; ++i) r.mutable_outputs()->add_taps(0);
  return r;
}

// Shapes whose byte count wraps modulo 2^64 (or whose element count is 0 while their strides
// overflow): they once threw out of torch::empty through the request path.
struct Overflow {
  std::string field;  // "noised" or "text"
  std::vector<int64_t> shape;
  std::string name() const {
    std::string s = field + " [";
    for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? "," : "", shape[i]);
    return s + "]";
  }
};

std::vector<Overflow> OverflowShapes() {
  const int64_t p31 = int64_t{1} << 31, p40 = int64_t{1} << 40, p62 = int64_t{1} << 62;
  std::vector<Overflow> out;
  for (const char* field : {"noised", "text"}) {
    for (std::vector<int64_t> shape :
         std::vector<std::vector<int64_t>>{{p62}, {p31, p31}, {p62, 1, 1}, {0, p40, p40}}) {
      out.push_back({field, shape});
    }
  }
  return out;
}

v1::StepRequest WithShape(const Overflow& o) {
  v1::StepRequest r = fixtures::Valid();
  v1::Tensor* t = o.field == "noised" ? r.mutable_noised() : r.mutable_text();
  t->set_dtype(v1::FLOAT32);
  t->clear_shape();
  for (int64_t d : o.shape) t->add_shape(d);
  t->clear_data();
  return r;
}

TEST(AttackTest, DuplicateTapsAreRefusedNamingOutputsTaps) {
  auto p = Start({"--drain_seconds=5"});
  ASSERT_GT(p->port(), 0);
  auto attacker = fixtures::Connect(p->port());
  const v1::StepRequest r = DuplicateTaps();
  EXPECT_GE(r.ByteSizeLong(), 56u << 10);
  const int64_t before = p->RssBytes();
  const int n = Repeats();
  for (int i = 0; i < n; ++i) {
    const absl::Status s = attacker->Step(r, kCall).status();
    ExpectRefused(s, absl::StatusCode::kInvalidArgument, "outputs.taps");
    EXPECT_TRUE(absl::StartsWith(s.message(), "outputs.taps")) << s;
    if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) break;
  }
  ExpectServed(p->port());
  const int64_t after = p->RssBytes();
  ReportRss("duplicate taps (58 KiB, Step)", before, after, n);
  EXPECT_LE(after - before, kRepeatGrowthBytes);
  ExpectCleanExit(*p, absl::Seconds(5), "after duplicate taps");
}

TEST(AttackTest, OverflowingShapesAreRefusedOnStepAndOnSession) {
  auto p = Start({"--drain_seconds=5"});
  ASSERT_GT(p->port(), 0);
  auto attacker = fixtures::Connect(p->port());
  const int n = Repeats();
  const int64_t before_step = p->RssBytes();
  for (int i = 0; i < n; ++i) {
    for (const Overflow& o : OverflowShapes()) {
      const absl::Status s = attacker->Step(WithShape(o), kCall).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << o.name() << ": " << s;
      EXPECT_TRUE(absl::StartsWith(s.message(), o.field)) << o.name() << ": " << s;
    }
    if (HasFailure()) break;
  }
  ExpectServed(p->port());
  const int64_t after_step = p->RssBytes();
  ReportRss("overflowing shapes (Step)", before_step, after_step,
            n * static_cast<int>(OverflowShapes().size()));
  EXPECT_LE(after_step - before_step, kRepeatGrowthBytes);

  // On a Session each is a StepError, and the same session then serves a valid step.
  std::unique_ptr<client::Session> session = attacker->OpenSession(absl::Seconds(600));
  const int64_t before_session = p->RssBytes();
  for (int i = 0; i < n; ++i) {
    for (const Overflow& o : OverflowShapes()) {
      const absl::Status s = session->Step(WithShape(o)).status();
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << o.name() << ": " << s;
      EXPECT_TRUE(absl::StartsWith(s.message(), o.field)) << o.name() << ": " << s;
    }
    if (HasFailure()) break;
  }
  const absl::StatusOr<client::StepReply> ok = session->Step(fixtures::Valid());
  EXPECT_TRUE(ok.ok()) << ok.status();
  ExpectServed(p->port());
  const int64_t after_session = p->RssBytes();
  ReportRss("overflowing shapes (Session)", before_session, after_session,
            n * static_cast<int>(OverflowShapes().size()));
  EXPECT_LE(after_session - before_session, kRepeatGrowthBytes);
  EXPECT_TRUE(session->Close().ok());
  ExpectCleanExit(*p, absl::Seconds(5), "after overflowing shapes");
}

// The request that once threw out of OnReadDone: the session answers a StepError and stays open;
// SIGTERM then ends it UNAVAILABLE and the process exits 0 within the grace.
TEST(AttackTest, ThrowingRequestOnASessionThenSigterm) {
  const absl::Duration grace = absl::Seconds(2);
  auto p = Start({"--drain_seconds=2"});
  ASSERT_GT(p->port(), 0);
  auto attacker = fixtures::Connect(p->port());
  std::unique_ptr<client::Session> session = attacker->OpenSession(absl::Seconds(120));
  const Overflow throwing{"noised", {0, int64_t{1} << 40, int64_t{1} << 40}};
  const int n = Repeats();
  const int64_t before = p->RssBytes();
  for (int i = 0; i < n; ++i) {
    ExpectRefused(session->Step(WithShape(throwing)).status(), absl::StatusCode::kInvalidArgument,
                  "noised");
    if (HasFailure()) break;
  }
  const absl::StatusOr<client::StepReply> ok = session->Step(fixtures::Valid());
  EXPECT_TRUE(ok.ok()) << ok.status();
  ExpectRefused(session->Step(WithShape(throwing)).status(), absl::StatusCode::kInvalidArgument,
                "noised");
  ExpectServed(p->port());
  ReportRss("throwing request (one Session)", before, p->RssBytes(), n + 1);
  ExpectCleanExit(*p, grace, "a Session after a throwing request");
  EXPECT_EQ(session->Close().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace praxis::serve::attack
