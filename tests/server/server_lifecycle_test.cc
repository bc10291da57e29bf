// The server's lifecycle (warm-up, drain) and its budgets (pending answers, session texts), each on
// a server of its own around a gated fake model. Part of the server_test binary.

#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/praxis_client.h"
#include "server/server.h"
#include "tests/server/fake_step_runner.h"
#include "tests/server/malformed_requests.h"
#include "tests/server/server_steps.h"

namespace praxis::serve {
namespace {

using client::Client;
using client::StepReply;
using fixtures::Eventually;
using fixtures::FakeStepRunner;
using fixtures::kLayouts;
using fixtures::kTimeout;
using grpc::health::v1::HealthCheckResponse;

// A server of its own (no metrics endpoint, a 1 ms batch delay) around a gated fake model, with
// a client that does not retry: for tests of the lifecycle and of budgets.
struct FakeServer {
  explicit FakeServer(ServerOptions o = {}) {
    auto owned = std::make_unique<FakeStepRunner>();
    fake = owned.get();
    o.address = "127.0.0.1:0";
    o.metrics_address = "";
    o.batch.max_queue_delay = absl::Milliseconds(1);
    server = PraxisServer::Create(o, std::move(owned)).value();
    client::ClientOptions co;
    co.max_attempts = 1;
    client = Client::Create(absl::StrCat("127.0.0.1:", server->port()), co).value();
  }
  FakeStepRunner* fake;
  std::unique_ptr<PraxisServer> server;
  std::unique_ptr<Client> client;
};

// A second server: the lifecycle around warm-up and drain.
TEST(ServerLifecycleTest, NotServingUntilWarmAndDrainFinishesAcceptedWork) {
  FakeServer s;
  FakeStepRunner* fake = s.fake;
  PraxisServer* server = s.server.get();
  Client* client = s.client.get();
  const v1::StepRequest r = fixtures::Valid();

  EXPECT_EQ(client->Health("", kTimeout).value(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(client->Step(r, kTimeout).status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(server->Warmup(kLayouts[0]).ok());
  EXPECT_EQ(client->Health("", kTimeout).value(), HealthCheckResponse::SERVING);

  std::unique_ptr<client::Session> idle = client->OpenSession(kTimeout);
  ASSERT_TRUE(idle->Step(r).ok());
  const int64_t entered = fake->batches_entered();
  fake->Close();
  absl::StatusOr<StepReply> running = absl::UnknownError(""), queued = absl::UnknownError("");
  std::thread a([&] { running = client->Step(r, kTimeout); });
  ASSERT_TRUE(fake->WaitEntered(entered + 1));
  std::thread b([&] { queued = client->Step(r, kTimeout); });
  ASSERT_TRUE(Eventually([&] { return server->batcher_stats().queued_requests == 1; }));
  std::thread drain([&] { server->Drain(absl::Seconds(30)); });
  ASSERT_TRUE(Eventually([&] {
    auto h = client->Health("", kTimeout);
    return h.ok() && *h == HealthCheckResponse::NOT_SERVING;
  }));
  EXPECT_EQ(client->Step(r, kTimeout).status().code(), absl::StatusCode::kUnavailable);
  const absl::StatusOr<StepReply> during = client->OpenSession(kTimeout)->Step(r);
  fake->Open();
  a.join();
  b.join();
  drain.join();
  EXPECT_TRUE(running.ok()) << running.status();
  EXPECT_TRUE(queued.ok()) << queued.status();
  // The idle session was ended by the drain with UNAVAILABLE (reconnect elsewhere), as was the one
  // opened during it.
  EXPECT_EQ(idle->Step(r).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(during.status().code(), absl::StatusCode::kUnavailable) << during.status();
}

// Answers nobody has taken yet are bounded: a step whose answer does not fit the pending budget is
// refused before it is queued, and the budget comes back once the answer is written.
TEST(ServerBudgetTest, PendingAnswersAreBoundedAndReleased) {
  const v1::StepRequest r = fixtures::Valid();  // a 30720-byte answer
  ServerOptions o;
  o.service.max_pending_response_bytes = 40000;
  FakeServer s(o);
  FakeStepRunner* fake = s.fake;
  PraxisServer* server = s.server.get();
  Client* client = s.client.get();
  ASSERT_TRUE(server->Warmup(kLayouts[0]).ok());
  fake->Close();
  absl::StatusOr<StepReply> held = absl::UnknownError("");
  std::thread a([&] { held = client->Step(r, kTimeout); });
  ASSERT_TRUE(Eventually([&] { return server->service_counts().pending_response_bytes > 0; }));
  EXPECT_EQ(server->service_counts().pending_response_bytes, 30720);
  const absl::Status refused = client->Step(r, kTimeout).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max_pending_response_bytes"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("not computed, retry later"), std::string::npos) << refused;
  fake->Open();
  a.join();
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(Eventually([&] { return server->service_counts().pending_response_bytes == 0; }));
  EXPECT_TRUE(client->Step(r, kTimeout).ok());
  server->Drain(absl::Seconds(10));
}

// A session whose text does not fit --max_session_text_bytes keeps none: its answers say so and
// the client sends the text with every step, which is answered as usual.
TEST(ServerBudgetTest, SessionTextsAreBoundedAndAnOverflowingOneIsSentEachStep) {
  ServerOptions o;
  o.service.max_session_text_bytes = 1000;  // the tiny model's 5-token text (960 bytes), not 7
  FakeServer s(o);
  ASSERT_TRUE(s.server->Warmup(kLayouts[0]).ok());
  std::unique_ptr<client::Session> small = s.client->OpenSession(kTimeout);
  const absl::StatusOr<StepReply> kept =
      small->Step(fixtures::Request(s.fake->config(), kLayouts[0], 1));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->header.text_kept());
  EXPECT_EQ(s.server->service_counts().session_text_bytes, 960);
  std::unique_ptr<client::Session> large = s.client->OpenSession(kTimeout);
  const v1::StepRequest r = fixtures::Request(s.fake->config(), kLayouts[1], 2);
  for (int i = 0; i < 2; ++i) {
    const absl::StatusOr<StepReply> full = large->Step(r);
    ASSERT_TRUE(full.ok()) << i << ": " << full.status();
    EXPECT_FALSE(full->header.text_kept()) << i;
  }
  EXPECT_EQ(s.server->service_counts().session_text_bytes, 960);
  EXPECT_TRUE(large->Close().ok());
  EXPECT_TRUE(small->Close().ok());
  EXPECT_TRUE(Eventually([&] { return s.server->service_counts().session_text_bytes == 0; }));
  s.server->Drain(absl::Seconds(10));
}

}  // namespace
}  // namespace praxis::serve
