// Issue 12's security posture, in process: the bearer token on every method (and on health unless
// exempt), reflection switched off, our health service's Watch through warm-up and drain, and
// metric labels free of paths. The real server on 127.0.0.1:0 with the tiny model.

#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/praxis_client.h"
#include "common/file_util.h"
#include "model/model_loader.h"
#include "server/auth.h"
#include "server/server.h"
#include "tests/server/malformed_requests.h"
#include "tests/server/metrics_text.h"
#include "tests/server/reflection_probe.h"

namespace praxis::serve {
namespace {

using client::Client;
using grpc::health::v1::HealthCheckResponse;

constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr char kTokens[] = "# praxis tokens\nalpha-token\n\n  beta-token \r\n";
constexpr wire::StepGeometry kWarmup = {
    .text_len = 5, .anchor_h = 3, .anchor_w = 4, .k = 2, .f = 1, .h = 3, .w = 4};

std::string TokenFile() {
  const std::string path = JoinPath(::testing::TempDir(), "praxis_tokens");
  EXPECT_TRUE(WriteStringToFile(path, kTokens).ok());
  return path;
}

// A warmed-up server with the tokens of kTokens; `exempt` health or not.
std::unique_ptr<PraxisServer> StartServer(bool exempt, bool reflection = true,
                                          const std::string& model = "embedded:tiny") {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.metrics_address = "127.0.0.1:0";
  o.batch.max_queue_delay = absl::Milliseconds(1);
  o.auth_token_file = TokenFile();
  o.auth_exempt_health = exempt;
  o.reflection = reflection;
  o.model = {model, "cpu", "float32", "dim 64, encoder 2, decoder 1"};
  o.config_json = model::kEmbeddedTinyConfig;
  auto runner = std::make_unique<model::BackboneStepRunner>(
      std::move(model::LoadModel({}, {}).value().model));
  auto server = PraxisServer::Create(o, std::move(runner)).value();
  EXPECT_TRUE(server->Warmup(kWarmup).ok());
  return server;
}

std::unique_ptr<Client> Connect(const PraxisServer& s, const std::string& token) {
  client::ClientOptions o;
  o.max_attempts = 1;
  o.token = token;
  return Client::Create(absl::StrCat("127.0.0.1:", s.port()), o).value();
}

// The status of each praxis.v1.Praxis method called through `c`.
std::vector<absl::Status> CallEveryMethod(const Client& c) {
  std::vector<absl::Status> out;
  out.push_back(c.Step(fixtures::Valid(), kTimeout).status());
  std::unique_ptr<client::Session> session = c.OpenSession(kTimeout);
  out.push_back(session->Step(fixtures::Valid()).status());
  out.push_back(c.Info(kTimeout).status());
  return out;
}

TEST(AuthTest, EveryMethodRefusesAMissingOrWrongTokenAndAcceptsEachListedOne) {
  auto server = StartServer(/*exempt=*/true);
  for (const absl::Status& s : CallEveryMethod(*Connect(*server, ""))) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "no bearer token")) << s;
  }
  for (const absl::Status& s : CallEveryMethod(*Connect(*server, "alpha-tokenX"))) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "invalid bearer token")) << s;
  }
  for (const std::string token : {"alpha-token", "beta-token"}) {
    for (const absl::Status& s : CallEveryMethod(*Connect(*server, token))) {
      EXPECT_TRUE(s.ok()) << token << ": " << s;
    }
  }
  // Refusals are counted like any other answer.
  const std::string m = fixtures::HttpGet(server->metrics_port(), "/metrics");
  EXPECT_EQ(fixtures::Sample(m, "praxis_requests_total",
                             {{"method", "Step"}, {"code", "UNAUTHENTICATED"}}),
            2);
  server->Drain(absl::Seconds(10));
}

TEST(AuthTest, AHeaderWithoutTheBearerSchemeIsRefused) {
  auto server = StartServer(/*exempt=*/true);
  auto stub = v1::Praxis::NewStub(Connect(*server, "")->channel());
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Basic alpha-token");
  v1::ModelInfo info;
  const grpc::Status s = stub->GetModelInfo(&ctx, v1::ModelInfoRequest(), &info);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "malformed")) << s.error_message();
  server->Drain(absl::Seconds(10));
}

TEST(AuthTest, HealthIsExemptByDefaultAndNeedsTheTokenOtherwise) {
  auto exempt = StartServer(/*exempt=*/true);
  EXPECT_EQ(Connect(*exempt, "")->Health("", kTimeout).value(), HealthCheckResponse::SERVING);
  EXPECT_EQ(Connect(*exempt, "")->Health("praxis.v1.Praxis", kTimeout).value(),
            HealthCheckResponse::SERVING);
  exempt->Drain(absl::Seconds(10));

  auto guarded = StartServer(/*exempt=*/false);
  for (const std::string service : {"", "praxis.v1.Praxis"}) {
    const auto none = Connect(*guarded, "")->Health(service, kTimeout);
    EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated) << none.status();
    const auto wrong = Connect(*guarded, "gamma-token")->Health(service, kTimeout);
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated) << wrong.status();
    EXPECT_EQ(Connect(*guarded, "beta-token")->Health(service, kTimeout).value(),
              HealthCheckResponse::SERVING);
  }
  // Watch too.
  auto stub = grpc::health::v1::Health::NewStub(Connect(*guarded, "")->channel());
  grpc::ClientContext ctx;
  auto reader = stub->Watch(&ctx, grpc::health::v1::HealthCheckRequest());
  HealthCheckResponse r;
  EXPECT_FALSE(reader->Read(&r));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  guarded->Drain(absl::Seconds(10));
}

TEST(AuthTest, TokenFilesWithoutTokensOrUnreadableAreRefused) {
  EXPECT_EQ(TokenAuthenticator::FromText("# only a comment\n\n  \n", "f").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenAuthenticator::Create("/nonexistent/tokens").status().code(),
            absl::StatusCode::kNotFound);
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.metrics_address = "";
  o.auth_token_file = "/nonexistent/tokens";
  auto runner = std::make_unique<model::BackboneStepRunner>(
      std::move(model::LoadModel({}, {}).value().model));
  EXPECT_EQ(PraxisServer::Create(o, std::move(runner)).status().code(),
            absl::StatusCode::kNotFound);
  auto auth = TokenAuthenticator::FromText(kTokens, "f").value();
  EXPECT_EQ(auth->token_count(), 2u);
  for (const absl::string_view h : {"Bearer alpha-token", "bearer beta-token"}) {
    EXPECT_TRUE(auth->CheckHeader(&h).ok()) << h;
  }
  for (const absl::string_view h : {"Bearer ", "Bearer alpha", "Bearer # praxis tokens", "x"}) {
    EXPECT_EQ(auth->CheckHeader(&h).code(), absl::StatusCode::kUnauthenticated) << h;
  }
}

TEST(ReflectionTest, CanBeSwitchedOffPerServer) {
  auto on = StartServer(/*exempt=*/true, /*reflection=*/true);
  auto off = StartServer(/*exempt=*/true, /*reflection=*/false);
  EXPECT_TRUE(fixtures::ListServices(Connect(*on, "")->channel(), kTimeout).status.ok());
  EXPECT_EQ(fixtures::ListServices(Connect(*off, "")->channel(), kTimeout).status.error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  on->Drain(absl::Seconds(10));
  off->Drain(absl::Seconds(10));
}

TEST(MetricsLabelTest, NoLabelValueCarriesAPath) {
  auto server = StartServer(/*exempt=*/true, /*reflection=*/true, "/models/secret/praxis-1/");
  ASSERT_TRUE(Connect(*server, "alpha-token")->Step(fixtures::Valid(), kTimeout).ok());
  const std::string m = fixtures::HttpGet(server->metrics_port(), "/metrics");
  EXPECT_EQ(fixtures::Sample(m, "praxis_model_info", {{"model", "praxis-1"}}), 1) << m;
  const std::regex label(R"re(\w+="([^"]*)")re");
  int values = 0;
  for (auto it = std::sregex_iterator(m.begin(), m.end(), label); it != std::sregex_iterator();
       ++it, ++values) {
    EXPECT_FALSE(absl::StrContains((*it)[1].str(), "/")) << (*it)[0].str();
  }
  EXPECT_GT(values, 10);
  server->Drain(absl::Seconds(10));
}

// Watch follows warm-up and drain, and an open Watch does not hold the drain up: the stream ends
// when health shuts down, long before the grace.
TEST(HealthWatchTest, FollowsWarmupAndDrainAndEndsWithTheDrain) {
  ServerOptions o;
  o.address = "127.0.0.1:0";
  o.metrics_address = "";
  auto runner = std::make_unique<model::BackboneStepRunner>(
      std::move(model::LoadModel({}, {}).value().model));
  auto server = PraxisServer::Create(o, std::move(runner)).value();
  auto stub = grpc::health::v1::Health::NewStub(Connect(*server, "")->channel());
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("praxis.v1.Praxis");
  auto reader = stub->Watch(&ctx, req);
  HealthCheckResponse r;
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE(server->Warmup(kWarmup).ok());
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), HealthCheckResponse::SERVING);
  const absl::Time start = absl::Now();
  std::thread drain([&] { server->Drain(absl::Seconds(30)); });
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(reader->Read(&r));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  drain.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace praxis::serve
