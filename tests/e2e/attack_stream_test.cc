// Attacks by readers that never read (attack_fixture.h says what every attack test asserts): large
// answers left unread, bounded by the pending-answer budget and cancelled by the write watchdog.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"
#include "tests/e2e/attack_fixture.h"
#include "tests/server/metrics_text.h"

namespace praxis::serve::attack {
namespace {

// A cheap request whose answer is large (every encoder feature of ~4,000 tokens, ~3.7 MB).
v1::StepRequest LargeAnswer() {
  return LayoutRequest(16, 24, 24, 2, 2, false, {"cond", "taps", "embeddings"});
}

// A Step call whose answer is never read: the reader is created (the request goes out) and left
// alone, so the client's flow-control window fills and the server's writes stall. gRPC 1.51's
// client delivers the status of a call only once what it buffered has been read, so the test reads
// it (Drain) only after the server has ended the call; the call's deadline bounds it otherwise.
class UnreadCall {
 public:
  UnreadCall(v1::Praxis::Stub& stub, const v1::StepRequest& request) {
    ctx_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    reader_ = stub.Step(&ctx_, request);
  }
  ~UnreadCall() {
    if (!drained_) {
      ctx_.TryCancel();
      Drain();
    }
  }
  // Reads what the client holds of the answer, then the call's status.
  grpc::Status Drain() {
    drained_ = true;
    v1::StepResponse msg;
    while (reader_->Read(&msg)) {
      bytes_ += static_cast<int64_t>(msg.chunk().data().size());
      for (const v1::TensorChunk& c : msg.answer().chunks()) bytes_ += std::ssize(c.data());
    }
    return reader_->Finish();
  }
  int64_t bytes() const { return bytes_; }  // tensor bytes read by Drain

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<v1::StepResponse>> reader_;
  bool drained_ = false;
  int64_t bytes_ = 0;
};

// The server's count of Step calls ended with `code` (praxis_requests_total).
int64_t StepsEnded(const ServerProcess& p, const std::string& code) {
  const std::string text = fixtures::HttpGet(p.metrics_port(), "/metrics");
  return static_cast<int64_t>(
      fixtures::Sample(text, "praxis_requests_total", {{"method", "Step"}, {"code", code}})
          .value_or(0));
}

// A stub on a TCP connection of its own (a local subchannel pool, and arguments no other channel
// has). BDP probing is off so that the window stays at its initial size: without reads, the
// client then takes at most that much of each answer.
std::unique_ptr<v1::Praxis::Stub> OwnConnection(int port, int tag) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt("praxis.attack.connection", tag);
  return v1::Praxis::NewStub(grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                                       grpc::InsecureChannelCredentials(), args));
}

// The largest VmRSS seen by polling every few milliseconds until destroyed.
class PeakRss {
 public:
  explicit PeakRss(const ServerProcess& p)
      : thread_([this, &p] {
          while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(5))) {
            peak_ = std::max<int64_t>(peak_, p.RssBytes());
          }
        }) {}
  ~PeakRss() { Stop(); }
  int64_t Stop() {
    if (!stop_.HasBeenNotified()) stop_.Notify();
    if (thread_.joinable()) thread_.join();
    return peak_;
  }

 private:
  std::atomic<int64_t> peak_{0};
  absl::Notification stop_;
  std::thread thread_;
};

// Read normally, a large answer is served (and its layout's masks are cached before a baseline).
void ExpectLargeAnswerServed(const client::Client& bystander, const v1::StepRequest& large) {
  const absl::StatusOr<client::StepReply> r = bystander.Step(large, kCall);
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t bytes = 0;
  for (const auto& [name, t] : r->tensors) bytes += t.nbytes();
  std::printf("[unread] each answer carries %.2f MiB; request %.2f MiB\n", MiB(bytes),
              MiB(large.ByteSizeLong()));
}

// Polls /metrics until `want` Step calls have ended RESOURCE_EXHAUSTED or CANCELLED, or 60 s pass;
// the count seen last.
int64_t WaitStepsRefusedOrCancelled(const ServerProcess& p, int64_t want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int64_t ended = 0;
  while (absl::Now() < deadline) {
    ended = StepsEnded(p, "RESOURCE_EXHAUSTED") + StepsEnded(p, "CANCELLED");
    if (ended >= want) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return ended;
}

// How the unread calls ended, once drained.
struct UnreadTally {
  int refused = 0;        // over the budget, never computed
  int cancelled = 0;      // stalled, cancelled by the write watchdog
  int64_t most_read = 0;  // the most bytes of one answer that reached its reader
};

// Drains every call; one that ended other than refused over the budget or cancelled fails the test.
UnreadTally DrainUnread(std::vector<std::unique_ptr<UnreadCall>>& calls) {
  UnreadTally tally;
  for (auto& call : calls) {
    const grpc::Status s = call->Drain();
    tally.most_read = std::max(tally.most_read, call->bytes());
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        absl::StrContains(s.error_message(), "--max_pending_response_bytes")) {
      ++tally.refused;
      EXPECT_EQ(call->bytes(), 0);  // never computed
    } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
      ++tally.cancelled;
    } else {
      ADD_FAILURE() << "unread call ended " << s.error_code() << ": " << s.error_message();
    }
  }
  return tally;
}

// SIGTERM while a reader stalls: the drain cancels it, the process exits 0 within the grace.
void ExpectDrainCancelsStalledReader(ServerProcess& p, const v1::StepRequest& large,
                                     absl::Duration grace) {
  auto stalled_stub = OwnConnection(p.port(), 100);
  UnreadCall stalled(*stalled_stub, large);
  ExpectServed(p.port());  // one worker, oldest first: the stalled answer is computed by now
  ExpectCleanExit(p, grace, "with a stalled reader");
  const grpc::Status s = stalled.Drain();
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::CANCELLED ||
              s.error_code() == grpc::StatusCode::UNAVAILABLE)
      << s.error_code() << ": " << s.error_message();
  EXPECT_TRUE(absl::StrContains(p.log(), "cancelled for stalled readers")) << p.log();
}

// 64 Step calls over 8 connections whose large answers are never read, against a 32 MiB answer
// budget and a 2 s write timeout: the calls beyond the budget are refused before they are
// computed, the server's memory stays within the budget plus a stated overhead, other clients are
// served, the stalled calls are cancelled after the timeout and their budget comes back; SIGTERM
// with a stalled reader present still exits 0 within the grace plus one second.
TEST(AttackTest, UnreadStreamsAreBoundedByThePendingBudgetAndCancelled) {
  constexpr int64_t kBudget = 32 * kMiB;
  // Above the idle RSS, besides the budget: one row's activations while it computes (batches of
  // one here: a batch of 9 such rows once peaked at +160 MiB, its activations being outside the
  // answer budget), the 64 requests in gRPC's buffers, and one chunk in flight per stalled call.
  constexpr int64_t kOverhead = 96 * kMiB;
  constexpr int kConnections = 8, kCallsPerConnection = 8;
  const absl::Duration grace = absl::Seconds(1);
  auto p = Start({absl::StrCat("--max_pending_response_bytes=", kBudget), "--write_timeout=2s",
                  "--drain_seconds=1", "--max_batch_size=1"});
  ASSERT_GT(p->port(), 0);
  const v1::StepRequest large = LargeAnswer();
  auto bystander = Bystander(p->port());
  ASSERT_NO_FATAL_FAILURE(ExpectLargeAnswerServed(*bystander, large));
  const int64_t idle = p->RssBytes();
  std::vector<std::unique_ptr<v1::Praxis::Stub>> stubs;
  for (int i = 0; i < kConnections; ++i) stubs.push_back(OwnConnection(p->port(), i));
  PeakRss peak(*p);
  std::vector<std::unique_ptr<UnreadCall>> calls;
  for (int i = 0; i < kConnections * kCallsPerConnection; ++i) {
    calls.push_back(std::make_unique<UnreadCall>(*stubs[i % kConnections], large));
  }
  // While they stall: the budget is full, so another large answer is refused, never computed;
  // a small step of another client is served.
  ExpectRefused(bystander->Step(large, kCall).status(), absl::StatusCode::kResourceExhausted,
                "--max_pending_response_bytes");
  ExpectServed(p->port(), absl::Seconds(10));
  // Each unread call ends on the server: refused at once, or cancelled by the write watchdog.
  const int64_t kUnread = kConnections * kCallsPerConnection;
  // With the bystander's refusal.
  EXPECT_EQ(WaitStepsRefusedOrCancelled(*p, kUnread + 1), kUnread + 1)
      << "Step calls ended by the server";
  const UnreadTally tally = DrainUnread(calls);
  EXPECT_LT(tally.most_read, 1 * kMiB) << "a stalled answer reached its reader";
  const int64_t high = peak.Stop();
  std::printf(
      "[unread] %zu unread calls: %d refused over the budget, %d cancelled as stalled "
      "(at most %.2f MiB of an answer reached a reader); RSS idle %.1f MiB, peak %.1f MiB "
      "(+%.1f MiB; bound: budget %.0f + overhead %.0f)\n",
      calls.size(), tally.refused, tally.cancelled, MiB(tally.most_read), MiB(idle), MiB(high),
      MiB(high - idle), MiB(kBudget), MiB(kOverhead));
  EXPECT_GE(tally.refused, 1);
  EXPECT_GE(tally.cancelled, 1);
  EXPECT_EQ(tally.refused + tally.cancelled, kConnections * kCallsPerConnection);
  EXPECT_LE(high - idle, kBudget + kOverhead);
  // The stalled answers were freed: the budget takes a large answer again.
  const absl::StatusOr<client::StepReply> again = bystander->Step(large, kCall);
  EXPECT_TRUE(again.ok()) << again.status();
  const int64_t after = p->RssBytes();
  ReportRss("64 unread streams: after cancellation", idle, after, 64);
  ReportRss("64 unread streams: peak while stalled", idle, high, 64);
  EXPECT_LE(after - idle, kBudget + kOverhead);
  calls.clear();
  ExpectDrainCancelsStalledReader(*p, large, grace);
}

}  // namespace
}  // namespace praxis::serve::attack
