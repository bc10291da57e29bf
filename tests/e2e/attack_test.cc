// Issue 12's attack test: praxis-server as a process (PRAXIS_SERVER_BIN), attacked over loopback
// as an unauthenticated client would. Each attack must be answered with its documented status
// while another client is still served, the server's resident memory must stay within a stated
// bound, and SIGTERM must still end it with exit status 0 within the drain grace plus one second.
//
// PRAXIS_ATTACK_REPEATS (default 50) sets how many hostile requests of each kind are sent for the
// memory figures; every test prints "[rss] kind: before ... after ... requests N" lines, so
//   PRAXIS_ATTACK_REPEATS=1000 ctest --test-dir build -R Attack -V | grep '\[rss\]'
// gives the table of the issue. PRAXIS_TINY_DIR names the tiny checkpoint (make_tiny_goldens).

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"
#include "client/request_builder.h"
#include "model/config.h"
#include "model/masks.h"
#include "model/model_loader.h"
#include "wire/synthetic.h"
#include "tests/e2e/server_process.h"
#include "tests/server/malformed_requests.h"
#include "tests/server/metrics_text.h"

namespace praxis::serve {
namespace {

using fixtures::ServerProcess;

constexpr absl::Duration kCall = absl::Seconds(30);
constexpr int64_t kMiB = int64_t{1} << 20;
// Growth of the resident set allowed over a run of hostile requests of one kind: allocator
// arenas and gRPC's buffers settle within it; the bugs of issue 12 grew it by hundreds of MiB.
constexpr int64_t kRepeatGrowthBytes = 64 * kMiB;

int Repeats() {
  int n = 50;
  const char* env = std::getenv("PRAXIS_ATTACK_REPEATS");
  if (env != nullptr && (!absl::SimpleAtoi(env, &n) || n < 1)) n = 50;
  return n;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / kMiB; }

// One line of the RSS table.
void ReportRss(const std::string& kind, int64_t before, int64_t after, int count) {
  std::printf("[rss] %-34s before %7.1f MiB  after %7.1f MiB  (%+6.1f MiB)  requests %d\n",
              kind.c_str(), MiB(before), MiB(after), MiB(after - before), count);
  std::fflush(stdout);
}

const model::BackboneConfig& TinyConfig() {
  static const auto* config =
      new model::BackboneConfig(model::ParseConfig(model::kEmbeddedTinyConfig).value());
  return *config;
}

// A valid request of `layout` (anchor grid = noised grid) asking for `outputs`.
v1::StepRequest LayoutRequest(int64_t text_len, int64_t h, int64_t w, int64_t k, int64_t f,
                              bool decode, std::vector<std::string> outputs) {
  const wire::StepGeometry layout{
      .text_len = text_len, .anchor_h = h, .anchor_w = w, .k = k, .f = f, .h = h, .w = w};
  model::StepInputs in = wire::SyntheticInputs(TinyConfig().step_dims(), layout, 1, /*seed=*/7);
  in.decode = decode;
  client::RequestOptions o;
  o.outputs = std::move(outputs);
  return client::MakeStepRequest(in, o).value();
}

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

// Within every shape limit (grid 32 x 32, 16 frames, 65,540 decoder tokens of one full-attention
// chunk): hundreds of GFLOP, minutes of the only worker before admission counted the cost.
v1::StepRequest ComputeBomb() { return LayoutRequest(8, 32, 32, 2, 8, true, {"velocity"}); }

// 16,388 decoder tokens: a dense [T, T] mask of 256 MiB, over --max_dense_mask_bytes (64 MiB).
v1::StepRequest DenseBomb() { return LayoutRequest(8, 16, 16, 1, 16, true, {"velocity"}); }

// A cheap request whose answer is large (every encoder feature of ~4,000 tokens, ~3.7 MB).
v1::StepRequest LargeAnswer() {
  return LayoutRequest(16, 24, 24, 2, 2, false, {"cond", "taps", "embeddings"});
}

// A server started with `flags`, serving; its log is printed if the test fails.
std::unique_ptr<ServerProcess> Start(std::vector<std::string> flags) {
  auto p = std::make_unique<ServerProcess>(std::move(flags));
  EXPECT_GT(p->pid(), 0) << "set PRAXIS_SERVER_BIN";
  if (p->pid() > 0) {
    EXPECT_TRUE(p->WaitServing()) << p->log();
  }
  return p;
}

// A client on a connection of its own (not shared with the attacker's).
std::unique_ptr<client::Client> Bystander(int port) {
  client::ClientOptions o;
  o.max_attempts = 1;
  o.own_connection = true;
  return client::Client::Create(absl::StrCat("127.0.0.1:", port), o).value();
}

// Another client's valid step is answered OK within `within`.
void ExpectServed(int port, absl::Duration within = absl::Seconds(5)) {
  const absl::Time start = absl::Now();
  const absl::StatusOr<client::StepReply> r = Bystander(port)->Step(fixtures::Valid(), kCall);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) {
    EXPECT_EQ(r->tensors.count("velocity"), 1u);
  }
  EXPECT_LE(absl::Now() - start, within);
}

void ExpectRefused(const absl::Status& s, absl::StatusCode code, const std::string& named) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), named)) << named << " in " << s;
}

// SIGTERM, then exit status 0 within `grace` + 1 s; prints and returns the time it took.
absl::Duration ExpectCleanExit(ServerProcess& p, absl::Duration grace, const std::string& what) {
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
    while (reader_->Read(&msg)) bytes_ += static_cast<int64_t>(msg.chunk().data().size());
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
  {  // read normally, it is served (and its layout's masks are cached before the baseline)
    const absl::StatusOr<client::StepReply> r = bystander->Step(large, kCall);
    ASSERT_TRUE(r.ok()) << r.status();
    int64_t bytes = 0;
    for (const auto& [name, t] : r->tensors) bytes += t.nbytes();
    std::printf("[unread] each answer carries %.2f MiB; request %.2f MiB\n", MiB(bytes),
                MiB(large.ByteSizeLong()));
  }
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
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  int64_t ended = 0;
  while (absl::Now() < deadline) {
    ended = StepsEnded(*p, "RESOURCE_EXHAUSTED") + StepsEnded(*p, "CANCELLED");
    if (ended >= kUnread + 1) break;  // with the bystander's refusal
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(ended, kUnread + 1) << "Step calls ended by the server";
  int refused = 0, cancelled = 0;
  int64_t most_read = 0;
  for (auto& call : calls) {
    const grpc::Status s = call->Drain();
    most_read = std::max(most_read, call->bytes());
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
        absl::StrContains(s.error_message(), "--max_pending_response_bytes")) {
      ++refused;
      EXPECT_EQ(call->bytes(), 0);  // never computed
    } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
      ++cancelled;
    } else {
      ADD_FAILURE() << "unread call ended " << s.error_code() << ": " << s.error_message();
    }
  }
  EXPECT_LT(most_read, 1 * kMiB) << "a stalled answer reached its reader";
  const int64_t high = peak.Stop();
  std::printf(
      "[unread] %zu unread calls: %d refused over the budget, %d cancelled as stalled "
      "(at most %.2f MiB of an answer reached a reader); RSS idle %.1f MiB, peak %.1f MiB "
      "(+%.1f MiB; bound: budget %.0f + overhead %.0f)\n",
      calls.size(), refused, cancelled, MiB(most_read), MiB(idle), MiB(high), MiB(high - idle),
      MiB(kBudget), MiB(kOverhead));
  EXPECT_GE(refused, 1);
  EXPECT_GE(cancelled, 1);
  EXPECT_EQ(refused + cancelled, kConnections * kCallsPerConnection);
  EXPECT_LE(high - idle, kBudget + kOverhead);
  // The stalled answers were freed: the budget takes a large answer again.
  const absl::StatusOr<client::StepReply> again = bystander->Step(large, kCall);
  EXPECT_TRUE(again.ok()) << again.status();
  const int64_t after = p->RssBytes();
  ReportRss("64 unread streams: after cancellation", idle, after, 64);
  ReportRss("64 unread streams: peak while stalled", idle, high, 64);
  EXPECT_LE(after - idle, kBudget + kOverhead);
  calls.clear();

  // SIGTERM while a reader stalls: the drain cancels it, the process exits 0 within the grace.
  auto stalled_stub = OwnConnection(p->port(), 100);
  UnreadCall stalled(*stalled_stub, large);
  ExpectServed(p->port());  // one worker, oldest first: the stalled answer is computed by now
  ExpectCleanExit(*p, grace, "with a stalled reader");
  const grpc::Status s = stalled.Drain();
  EXPECT_TRUE(s.error_code() == grpc::StatusCode::CANCELLED ||
              s.error_code() == grpc::StatusCode::UNAVAILABLE)
      << s.error_code() << ": " << s.error_message();
  EXPECT_TRUE(absl::StrContains(p->log(), "cancelled for stalled readers")) << p->log();
}

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
}  // namespace praxis::serve
