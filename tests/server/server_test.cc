// The real server on 127.0.0.1:0 through the real client, on a fake model: serving (health,
// chunking, batching, budgets, deadlines, cancellation, sessions, metrics), not numerics, which
// server_model_test.cc checks on the tiny model. Lifecycle and budgets: server_lifecycle_test.cc.

#include "server/server.h"

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/praxis_client.h"
#include "client/step_assembler.h"
#include "model/model_loader.h"
#include "server/step_request.h"
#include "tests/server/fake_step_runner.h"
#include "tests/server/malformed_requests.h"
#include "tests/server/metrics_text.h"
#include "tests/server/reflection_probe.h"
#include "tests/server/server_steps.h"

namespace praxis::serve {
namespace {

using client::Client;
using client::StepReply;
using fixtures::Eventually;
using fixtures::FakeStepRunner;
using fixtures::kLayouts;
using fixtures::kTimeout;
using fixtures::MaxAbsDiff;
using grpc::health::v1::HealthCheckResponse;

constexpr int64_t kChunkBytes = 4096;
constexpr int64_t kQueueRequests = 40;

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto fake = std::make_unique<FakeStepRunner>();
    fake_ = fake.get();
    ServerOptions o;
    o.address = "127.0.0.1:0";
    o.metrics_address = "127.0.0.1:0";
    o.batch.max_batch_rows = 8;
    o.batch.max_queue_delay = absl::Milliseconds(20);
    o.batch.max_queue_requests = kQueueRequests;
    o.service.max_chunk_bytes = kChunkBytes;
    o.max_message_bytes = 4 << 20;
    o.model = {"embedded:tiny", "cpu", "float32", "tiny"};
    o.config_json = model::kEmbeddedTinyConfig;
    server_ = PraxisServer::Create(o, std::move(fake)).value().release();
    ASSERT_TRUE(server_->Warmup(kLayouts[0]).ok());
    client::ClientOptions co;
    co.max_attempts = 1;
    client_ = Client::Create(absl::StrCat("127.0.0.1:", server_->port()), co).value().release();
  }
  static void TearDownTestSuite() {
    server_->Drain(absl::Seconds(10));
    delete client_;
    delete server_;
  }
  void TearDown() override { fake_->Open(); }

  static const model::BackboneConfig& config() { return fake_->config(); }

  static v1::StepRequest Request(const wire::StepGeometry& layout, uint64_t seed,
                                 bool decode = true, int64_t rows = 1) {
    return fixtures::Request(config(), layout, seed, decode, rows);
  }

  // What the fake model answers for `r` alone, by output name.
  static std::map<std::string, torch::Tensor> Expected(const v1::StepRequest& r) {
    const DecodedStep d = DecodeStepRequest(r, config()).value();
    return fixtures::ByName(FakeStepRunner::Outputs(config(), d.inputs, torch::kFloat32));
  }

  static absl::StatusOr<StepReply> Step(const v1::StepRequest& r,
                                        absl::Duration timeout = kTimeout) {
    return client_->Step(r, timeout);
  }

  static std::string Metrics() { return fixtures::HttpGet(server_->metrics_port(), "/metrics"); }

  static inline FakeStepRunner* fake_ = nullptr;
  static inline PraxisServer* server_ = nullptr;
  static inline Client* client_ = nullptr;
};

TEST_F(ServerTest, HealthIsServingAndModelInfoDescribesTheModel) {
  EXPECT_EQ(client_->Health("", kTimeout).value(), HealthCheckResponse::SERVING);
  EXPECT_EQ(client_->Health("praxis.v1.Praxis", kTimeout).value(), HealthCheckResponse::SERVING);
  const v1::ModelInfo info = client_->Info(kTimeout).value();
  EXPECT_EQ(info.dtype(), "float32");
  EXPECT_EQ(info.device(), "cpu");
  EXPECT_EQ(info.model(), "embedded:tiny");
  EXPECT_EQ(info.max_batch_rows(), 8);
  EXPECT_EQ(info.max_chunk_bytes(), kChunkBytes);
  EXPECT_TRUE(absl::StrContains(info.config_json(), "\"backbone\""));
  EXPECT_EQ(
      std::vector<std::string>(info.outputs().begin(), info.outputs().end()),
      (std::vector<std::string>{"velocity", "cond", "embeddings", "positions", "tap.0", "tap.1"}));
}

// The reflection service answers list_services (ServerReflectionRequest field 7) with our
// services. Raw bytes over a generic call: this binary cannot also compile reflection.proto.
TEST_F(ServerTest, ReflectionListsTheServices) {
  const fixtures::ListServicesReply reply = fixtures::ListServices(client_->channel(), kTimeout);
  EXPECT_TRUE(reply.status.ok()) << reply.status.error_message();
  EXPECT_TRUE(absl::StrContains(reply.bytes, "praxis.v1.Praxis"));
  EXPECT_TRUE(absl::StrContains(reply.bytes, "grpc.health.v1.Health"));
}

// Only what was asked for is sent, and every chunk respects the limit.
TEST_F(ServerTest, OutputsArriveInBoundedContiguousChunks) {
  v1::StepRequest r = Request(kLayouts[2], 8, true, /*rows=*/3);
  r.mutable_outputs()->Clear();
  r.mutable_outputs()->set_velocity(true);
  r.mutable_outputs()->add_taps(1);
  auto stub = v1::Praxis::NewStub(client_->channel());
  grpc::ClientContext ctx;
  auto reader = stub->Step(&ctx, r);
  v1::StepResponse msg;
  std::vector<std::string> kinds;
  std::map<std::string, int64_t> received;
  int max_chunks_per_tensor = 0;
  std::map<std::string, int> chunks;
  while (reader->Read(&msg)) {
    if (msg.has_header()) {
      kinds.push_back("header");
      ASSERT_EQ(msg.header().tensors_size(), 2);
      EXPECT_EQ(msg.header().tensors(0).name(), "velocity");
      EXPECT_EQ(msg.header().tensors(1).name(), "tap.1");
    } else if (msg.has_chunk()) {
      const v1::TensorChunk& c = msg.chunk();
      EXPECT_LE(static_cast<int64_t>(c.data().size()), kChunkBytes);
      EXPECT_EQ(c.offset(), received[c.name()]);
      received[c.name()] += c.data().size();
      max_chunks_per_tensor = std::max(max_chunks_per_tensor, ++chunks[c.name()]);
    } else if (msg.has_trailer()) {
      kinds.push_back("trailer");
    }
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(kinds, (std::vector<std::string>{"header", "trailer"}));
  // velocity: 3 x 4 x 3 x 4 x 10 floats = 5760 bytes; tap.1: 3 x 97 x 64 floats.
  EXPECT_EQ(received["velocity"], 3 * 4 * 3 * 4 * 10 * 4);
  EXPECT_GT(max_chunks_per_tensor, 1);
}

// Asked for, an answer that fits one chunk is one StepAnswer message on a Step call and on each
// step of a Session, and assembles to the model's output; not asked for, the stream of three.
TEST_F(ServerTest, AWholeAnswerIsOneMessageOnStepAndSession) {
  v1::StepRequest r = Request(kLayouts[0], 77);
  r.mutable_outputs()->Clear();
  r.mutable_outputs()->set_velocity(true);
  const torch::Tensor want = Expected(r).at("velocity");
  ASSERT_LE(want.nbytes(), static_cast<size_t>(kChunkBytes));
  auto stub = v1::Praxis::NewStub(client_->channel());
  for (const bool whole : {true, false}) {
    SCOPED_TRACE(whole ? "whole answer" : "stream");
    r.set_whole_answer(whole);
    const size_t messages = whole ? 1 : 3;  // header, one chunk, trailer
    {
      grpc::ClientContext ctx;
      auto reader = stub->Step(&ctx, r);
      client::StepAssembler assembler;
      std::vector<v1::StepResponse> got;
      for (v1::StepResponse msg; reader->Read(&msg);) got.push_back(msg);
      ASSERT_TRUE(reader->Finish().ok());
      ASSERT_EQ(got.size(), messages);
      EXPECT_EQ(got[0].has_answer(), whole);
      for (const v1::StepResponse& msg : got) ASSERT_TRUE(assembler.Add(msg).ok());
      EXPECT_TRUE(torch::equal(assembler.Take().tensors.at("velocity"), want));
    }
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(stream->Write(r));
      client::StepAssembler assembler;
      size_t read = 0;
      absl::StatusOr<bool> done = false;
      for (v1::StepResponse msg; done.ok() && !*done && stream->Read(&msg); ++read) {
        done = assembler.Add(msg);
      }
      ASSERT_TRUE(done.ok() && *done) << done.status();
      EXPECT_EQ(read, messages) << "step " << step;
      EXPECT_TRUE(torch::equal(assembler.Take().tensors.at("velocity"), want));
    }
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_TRUE(stream->Finish().ok());
  }
}

TEST_F(ServerTest, ConcurrentCallersEachGetTheirOwnRows) {
  constexpr int kCallers = 32;
  std::vector<v1::StepRequest> requests;
  std::vector<std::map<std::string, torch::Tensor>> expected;
  for (int i = 0; i < kCallers; ++i) {
    requests.push_back(Request(kLayouts[i % 3], 1000 + i));
    expected.push_back(Expected(requests.back()));
  }
  const std::string before = Metrics();
  fake_->Close();  // hold the first batch so the others queue up and batch together
  std::vector<absl::StatusOr<StepReply>> replies(kCallers, absl::UnknownError("not run"));
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] { replies[i] = Step(requests[i]); });
  }
  ASSERT_TRUE(Eventually([&] { return server_->batcher_stats().queued_requests >= kCallers - 8; }));
  fake_->Open();
  for (std::thread& t : callers) t.join();
  int32_t max_batch = 0;
  for (int i = 0; i < kCallers; ++i) {
    ASSERT_TRUE(replies[i].ok()) << i << ": " << replies[i].status();
    EXPECT_EQ(replies[i]->header.request_id(), requests[i].request_id());
    max_batch = std::max(max_batch, replies[i]->header.batch_rows());
    for (const auto& [name, want] : expected[i]) {
      const torch::Tensor& got = replies[i]->tensors.at(name);
      EXPECT_LE(MaxAbsDiff(got, want), 1e-5) << "caller " << i << " " << name;
      // Not some other caller's rows: those of the same layout differ by far more.
      if (name == "cond") {
        EXPECT_GT(MaxAbsDiff(got, expected[i >= 3 ? i - 3 : i + 3][name]), 1e-2);
      }
    }
  }
  EXPECT_GT(max_batch, 1);
  const std::string after = Metrics();
  const double batches = *fixtures::Sample(after, "praxis_batch_rows_count") -
                         fixtures::Sample(before, "praxis_batch_rows_count").value_or(0);
  const double solo =
      *fixtures::Sample(after, "praxis_batch_rows_bucket", {{"le", "1"}}) -
      fixtures::Sample(before, "praxis_batch_rows_bucket", {{"le", "1"}}).value_or(0);
  EXPECT_LT(solo, batches) << "the batch-size histogram shows no batch > 1";
  EXPECT_LT(batches, kCallers);
  // The held batch finished with the others queued: its answers went to the answer pipeline
  // (counted by the worker just after the hand-off, so perhaps after its callers were answered).
  const double pipelined_before =
      fixtures::Sample(before, "praxis_pipelined_answers_total").value_or(0);
  EXPECT_TRUE(Eventually([&] {
    return fixtures::Sample(Metrics(), "praxis_pipelined_answers_total").value_or(0) >=
           pipelined_before + 1;
  }));
}

TEST_F(ServerTest, FullQueueIsRefusedAtOnceWithResourceExhausted) {
  const int64_t entered = fake_->batches_entered();
  fake_->Close();
  std::vector<absl::StatusOr<StepReply>> replies(kQueueRequests + 1, absl::UnknownError(""));
  std::vector<std::thread> callers;
  callers.emplace_back([&] { replies[0] = Step(Request(kLayouts[0], 1)); });
  ASSERT_TRUE(fake_->WaitEntered(entered + 1));  // the first runs (held at the gate)
  for (int i = 1; i <= kQueueRequests; ++i) {
    callers.emplace_back([&, i] { replies[i] = Step(Request(kLayouts[i % 3], i)); });
  }
  ASSERT_TRUE(
      Eventually([&] { return server_->batcher_stats().queued_requests == kQueueRequests; }));
  const absl::StatusOr<StepReply> refused = Step(Request(kLayouts[1], 99));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "queue full"));
  fake_->Open();
  for (std::thread& t : callers) t.join();
  for (const auto& r : replies) EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_GE(*fixtures::Sample(Metrics(), "praxis_requests_total",
                              {{"method", "Step"}, {"code", "RESOURCE_EXHAUSTED"}}),
            1);
}

TEST_F(ServerTest, ExpiredDeadlineIsAnsweredAndNeverComputed) {
  const int64_t entered = fake_->batches_entered();
  const int64_t rows_before = fake_->rows_run();
  const double computed_before = *fixtures::Sample(Metrics(), "praxis_computed_rows_total");
  fake_->Close();
  absl::StatusOr<StepReply> first = absl::UnknownError("");
  std::thread runner([&] { first = Step(Request(kLayouts[0], 2)); });
  ASSERT_TRUE(fake_->WaitEntered(entered + 1));
  const int64_t cancelled_before = server_->service_counts().cancelled_calls;
  const batching::BatcherStats dropped_before = server_->batcher_stats();
  const absl::StatusOr<StepReply> late = Step(Request(kLayouts[1], 3), absl::Milliseconds(300));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  // The client's deadline passes before the server's (which starts at arrival): open the gate
  // only once the server has seen the call end, by its own deadline or the client's cancel.
  ASSERT_TRUE(
      Eventually([&] { return server_->service_counts().cancelled_calls > cancelled_before; }));
  fake_->Open();
  runner.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(Eventually([&] { return server_->batcher_stats().queued_requests == 0; }));
  EXPECT_EQ(fake_->rows_run(), rows_before + 1);  // the first request only
  EXPECT_EQ(*fixtures::Sample(Metrics(), "praxis_computed_rows_total"), computed_before + 1);
  const batching::BatcherStats after = server_->batcher_stats();
  EXPECT_EQ(after.expired + after.cancelled, dropped_before.expired + dropped_before.cancelled + 1);
}

TEST_F(ServerTest, CancelledWhileQueuedIsNeverComputed) {
  const int64_t entered = fake_->batches_entered();
  const int64_t rows_before = fake_->rows_run();
  fake_->Close();
  absl::StatusOr<StepReply> first = absl::UnknownError("");
  std::thread runner([&] { first = Step(Request(kLayouts[0], 4)); });
  ASSERT_TRUE(fake_->WaitEntered(entered + 1));
  auto stub = v1::Praxis::NewStub(client_->channel());
  grpc::ClientContext ctx;
  grpc::Status cancelled_status;
  std::thread cancelled([&] {
    auto reader = stub->Step(&ctx, Request(kLayouts[1], 5));
    v1::StepResponse msg;
    while (reader->Read(&msg)) {
    }
    cancelled_status = reader->Finish();
  });
  ASSERT_TRUE(Eventually([&] { return server_->batcher_stats().queued_requests == 1; }));
  const int64_t cancelled_before = server_->service_counts().cancelled_calls;
  ctx.TryCancel();
  cancelled.join();
  EXPECT_EQ(cancelled_status.error_code(), grpc::StatusCode::CANCELLED);
  // The client's cancel reaches the server later: open the gate once it has.
  ASSERT_TRUE(
      Eventually([&] { return server_->service_counts().cancelled_calls > cancelled_before; }));
  fake_->Open();
  runner.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(Eventually([&] { return server_->batcher_stats().queued_requests == 0; }));
  EXPECT_EQ(fake_->rows_run(), rows_before + 1);
}

TEST_F(ServerTest, MalformedRequestsAreRefusedNamingTheFieldAndTheServerServesOn) {
  const std::vector<fixtures::Malformed> cases = fixtures::MalformedCases();
  ASSERT_GE(cases.size(), 25u);
  for (const fixtures::Malformed& c : cases) {
    v1::StepRequest r = fixtures::Valid();
    c.mutate(r);
    const absl::StatusOr<StepReply> reply = Step(r);
    ASSERT_FALSE(reply.ok()) << c.name;
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_TRUE(absl::StartsWith(reply.status().message(), c.field))
        << c.name << ": " << reply.status().message();
  }
  // Over --max_message_bytes (4 MiB here): gRPC itself refuses it before our code sees it.
  v1::StepRequest huge = fixtures::Valid();
  huge.mutable_text()->mutable_data()->resize(5 << 20);
  EXPECT_EQ(Step(huge).status().code(), absl::StatusCode::kResourceExhausted);
  const absl::StatusOr<StepReply> ok = Step(fixtures::Valid());
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST_F(ServerTest, SessionAnswersStepsInOrderAndSurvivesABadStep) {
  std::unique_ptr<client::Session> session = client_->OpenSession(kTimeout);
  for (int i = 0; i < 4; ++i) {
    v1::StepRequest r = Request(kLayouts[i % 3], 300 + i);
    if (i == 2) {
      r.set_frames_per_chunk(0);
      const absl::StatusOr<StepReply> bad = session->Step(r);
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StartsWith(bad.status().message(), "frames_per_chunk"));
      continue;
    }
    const absl::StatusOr<StepReply> reply = session->Step(r);
    ASSERT_TRUE(reply.ok()) << i << ": " << reply.status();
    EXPECT_EQ(reply->header.request_id(), r.request_id());
    for (const auto& [name, want] : Expected(r)) {
      EXPECT_TRUE(torch::equal(reply->tensors.at(name), want)) << i << " " << name;
    }
  }
  EXPECT_TRUE(session->Close().ok());
}

// A model failure that throws (LibTorch does) is that step's INTERNAL, answered as a StepError;
// the session, and the server, go on.
TEST_F(ServerTest, ASessionStepThatThrowsIsAnsweredAndTheSessionGoesOn) {
  std::unique_ptr<client::Session> session = client_->OpenSession(kTimeout);
  fake_->ThrowNext();
  const absl::StatusOr<StepReply> failed = session->Step(Request(kLayouts[0], 600));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(failed.status().message().find("injected failure"), std::string::npos)
      << failed.status();
  const v1::StepRequest r = Request(kLayouts[1], 601);
  const absl::StatusOr<StepReply> next = session->Step(r);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->header.request_id(), r.request_id());
  EXPECT_TRUE(session->Close().ok());
}

// A robot's instruction crosses the wire once per session: the answer says the server keeps the
// text, the client leaves an equal text out of the next steps, and those steps are answered as if
// it had been sent. A new text is sent and kept in its place; closing frees it.
TEST_F(ServerTest, ASessionSendsItsTextOnceAndTheServerKeepsIt) {
  using fixtures::Sample;
  // Earlier tests' sessions are freed when the server has finished them, just after they close.
  ASSERT_TRUE(Eventually([] { return server_->service_counts().session_text_bytes == 0; }));
  std::unique_ptr<client::Session> session = client_->OpenSession(kTimeout);
  const v1::StepRequest first = Request(kLayouts[0], 700);
  const absl::StatusOr<StepReply> kept = session->Step(first);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->header.text_kept());
  const int64_t text_bytes = 5 * config().text_dim * 4;
  EXPECT_EQ(server_->service_counts().session_text_bytes, text_bytes);
  EXPECT_EQ(Sample(Metrics(), "praxis_session_text_bytes"), text_bytes);

  v1::StepRequest same_text = Request(kLayouts[0], 701);
  *same_text.mutable_text() = first.text();
  const double received = Sample(Metrics(), "praxis_received_bytes_total").value();
  const absl::StatusOr<StepReply> reused = session->Step(same_text);
  ASSERT_TRUE(reused.ok()) << reused.status();
  EXPECT_TRUE(reused->header.text_kept());
  EXPECT_EQ(reused->header.request_id(), same_text.request_id());  // every other field sent
  EXPECT_EQ(reused->tensors.size(), Expected(same_text).size());
  const double sent = Sample(Metrics(), "praxis_received_bytes_total").value() - received;
  EXPECT_LE(sent, static_cast<double>(same_text.ByteSizeLong() - text_bytes)) << "text left out";
  for (const auto& [name, want] : Expected(same_text)) {
    EXPECT_TRUE(torch::equal(reused->tensors.at(name), want)) << name;
  }

  const v1::StepRequest other = Request(kLayouts[1], 702);  // another text, 7 tokens long
  const absl::StatusOr<StepReply> replaced = session->Step(other);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  for (const auto& [name, want] : Expected(other)) {
    EXPECT_TRUE(torch::equal(replaced->tensors.at(name), want)) << name;
  }
  EXPECT_EQ(server_->service_counts().session_text_bytes, 7 * config().text_dim * 4);
  EXPECT_TRUE(session->Close().ok());
  EXPECT_TRUE(Eventually([] { return server_->service_counts().session_text_bytes == 0; }));
}

// A step may leave its text out only on a session that keeps one, of as many rows: else it is
// refused naming text, and the session goes on. A refused step that sent a text keeps none.
TEST_F(ServerTest, AStepWithoutTextNeedsTheSessionsKeptText) {
  v1::StepRequest no_text = Request(kLayouts[0], 710);
  no_text.clear_text();
  const absl::Status unary = Step(no_text).status();
  EXPECT_EQ(unary.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(unary.message(), "text: expected a tensor")) << unary;

  std::unique_ptr<client::Session> session = client_->OpenSession(kTimeout);
  const absl::Status first = session->Step(no_text).status();
  EXPECT_EQ(first.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(first.message(), "text_kept")) << first;
  ASSERT_TRUE(session->Step(Request(kLayouts[0], 711)).ok());  // one row kept
  v1::StepRequest two_rows = Request(kLayouts[0], 712, true, 2);
  two_rows.clear_text();
  const absl::Status rows = session->Step(two_rows).status();
  EXPECT_EQ(rows.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(rows.message(), "text: left out")) << rows;
  const absl::StatusOr<StepReply> after = session->Step(no_text);  // the kept row, still there
  ASSERT_TRUE(after.ok()) << after.status();
  v1::StepRequest with_kept = no_text;
  *with_kept.mutable_text() = Request(kLayouts[0], 711).text();
  for (const auto& [name, want] : Expected(with_kept)) {
    EXPECT_TRUE(torch::equal(after->tensors.at(name), want)) << name;
  }
  // A step that sends a text and is refused leaves none kept: never an older one.
  v1::StepRequest refused = Request(kLayouts[0], 713);
  refused.set_frames_per_chunk(0);
  EXPECT_EQ(session->Step(refused).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server_->service_counts().session_text_bytes, 0);
  const absl::Status none = session->Step(no_text).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(none.message(), "text_kept")) << none;
  EXPECT_TRUE(session->Close().ok());
}

TEST_F(ServerTest, MetricsAreScrapedOverHttp) {
  ASSERT_TRUE(Eventually([] { return server_->service_counts().session_text_bytes == 0; }));
  ASSERT_TRUE(Step(Request(kLayouts[0], 11)).ok());
  ASSERT_TRUE(Step(Request(kLayouts[0], 12)).ok());
  const std::string m = Metrics();
  ASSERT_FALSE(m.empty());
  using fixtures::Sample;
  EXPECT_GE(Sample(m, "praxis_requests_total", {{"method", "Step"}, {"code", "OK"}}).value_or(0),
            2);
  EXPECT_GE(Sample(m, "praxis_latency_seconds_count", {{"method", "Step"}}).value_or(0), 2);
  EXPECT_GE(Sample(m, "praxis_queue_seconds_count").value_or(0), 2);
  EXPECT_GE(Sample(m, "praxis_compute_seconds_count").value_or(0), 1);
  EXPECT_GE(Sample(m, "praxis_batch_rows_count").value_or(0), 1);
  for (const char* phase : {"stack", "model", "split", "answer"}) {
    EXPECT_GE(Sample(m, "praxis_batch_phase_seconds_count", {{"phase", phase}}).value_or(0), 1)
        << phase;
  }
  EXPECT_GE(Sample(m, "praxis_mask_cache_hits_total").value_or(0), 1);
  EXPECT_GE(Sample(m, "praxis_mask_cache_misses_total").value_or(0), 1);
  EXPECT_GE(Sample(m, "praxis_mask_cache_entries").value_or(0), 1);
  EXPECT_GT(Sample(m, "praxis_mask_cache_bytes").value_or(0), 0);
  EXPECT_EQ(Sample(m, "praxis_pending_response_bytes").value_or(-1), 0) << "nothing unread";
  EXPECT_EQ(Sample(m, "praxis_session_text_bytes").value_or(-1), 0) << "no session open";
  EXPECT_EQ(Sample(m, "praxis_write_timeouts_total").value_or(-1), 0);
  EXPECT_TRUE(Sample(m, "praxis_mask_cache_evictions_total").has_value());
  for (const char* family : {"praxis_text_cache_hits_total", "praxis_text_cache_misses_total",
                             "praxis_text_cache_evictions_total", "praxis_text_cache_entries",
                             "praxis_text_cache_bytes"}) {
    EXPECT_TRUE(Sample(m, family).has_value()) << family;
  }
  EXPECT_TRUE(Sample(m, "praxis_pipelined_answers_total").has_value());
  EXPECT_EQ(Sample(m, "praxis_side_by_side_batches_total"), 0) << "one worker runs batches alone";
  EXPECT_EQ(Sample(m, "praxis_queue_depth"), 0);
  EXPECT_TRUE(Sample(m, "praxis_queue_bytes").has_value());
  EXPECT_EQ(Sample(m, "praxis_model_info", {{"model", "embedded:tiny"}, {"dtype", "float32"}}), 1);
  EXPECT_GT(Sample(m, "praxis_received_bytes_total").value_or(0), 0);
  EXPECT_GT(Sample(m, "praxis_sent_bytes_total").value_or(0), 0);
  EXPECT_EQ(Sample(m, "praxis_serving"), 1);
}

}  // namespace
}  // namespace praxis::serve
