#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "model/step_runner.h"
#include "server/answer_pipeline.h"
#include "server/auth.h"
#include "server/batching/batch_policy.h"
#include "server/batching/batcher.h"
#include "server/health_service.h"
#include "server/metrics.h"
#include "server/praxis_service.h"
#include "wire/step_inputs.h"

namespace praxis::serve {

// Everything praxis-server runs, composed (main.cc fills it from flags).
struct ServerOptions {
  std::string address = "0.0.0.0:50051";         // port 0 picks one; see PraxisServer::port
  std::string metrics_address = "0.0.0.0:9090";  // empty: no metrics endpoint
  bool reflection = true;                        // serve grpc.reflection.v1alpha
  std::string auth_token_file;     // bearer tokens, one per line; empty: no authentication
  bool auth_exempt_health = true;  // health answers without a token (for probes)
  std::string tls_cert_file;       // PEM; with tls_key_file, serve TLS instead of plaintext
  std::string tls_key_file;
  std::string tls_client_ca_file;  // PEM; when set, clients must present a certificate it signed
  int64_t max_message_bytes = int64_t{64} << 20;    // largest request gRPC accepts
  int max_streams_per_connection = 64;              // concurrent calls on one HTTP/2 connection
  int64_t request_memory_bytes = int64_t{1} << 30;  // gRPC's ResourceQuota for the whole server
  batching::BatchOptions batch;
  ServiceOptions service;
  // Batcher workers: batches that may run at once, sharing the machine (batching::Batcher).
  int workers = 1;
  // Answer a batch on a thread of its own while the worker starts the next (AnswerPipeline).
  bool answer_pipeline = true;
  ModelLabels model;
  std::string config_json;  // the model's config.json, returned by GetModelInfo
  std::string compute;      // what the hardware implies for the dtype, returned by GetModelInfo
};

// A warm-up step: a layout and its batch rows (--warmup, --warmup_rows).
struct WarmupStep {
  wire::StepGeometry layout;
  int64_t rows = 1;
};

// praxis-server: praxis.v1.Praxis, grpc.health.v1.Health and server reflection on one gRPC port,
// the batcher, and /metrics, around one StepRunner it owns. With a token file, every call (health
// too, unless exempt) must carry one of its tokens as `authorization: Bearer <token>`.
//
// Lifecycle: Create (listening; health NOT_SERVING; steps refused UNAVAILABLE) → Warmup (SERVING)
// → Drain (NOT_SERVING; new steps refused UNAVAILABLE; queued and in-flight steps finished within
// the grace) → destruction. Thread-safe.
class PraxisServer {
 public:
  // Unavailable naming the address when a port cannot be bound; InvalidArgument for bad TLS files
  // or a token file without tokens, NotFound for an unreadable one.
  static absl::StatusOr<std::unique_ptr<PraxisServer>> Create(
      ServerOptions options, std::unique_ptr<model::StepRunner> runner);
  // Drains with no grace if Drain was not called.
  ~PraxisServer();
  PraxisServer(const PraxisServer&) = delete;
  PraxisServer& operator=(const PraxisServer&) = delete;

  // Runs a synthetic step (both towers) of each layout and row count in `steps`, so that their
  // first requests pay no lazy initialisation (on CUDA: each one's graph is captured here), then
  // serves. The error of the first step that fails (the server stays NOT_SERVING).
  absl::Status Warmup(absl::Span<const WarmupStep> steps);
  // One step of `layout` with one row.
  absl::Status Warmup(const wire::StepGeometry& layout) { return Warmup({{layout, 1}}); }
  // Stops serving and finishes the accepted work within `grace` (SPEC §7), in three bounded
  // phases: the batcher runs what is queued, then written answers reach their readers, then gRPC
  // cancels whatever is left. False when a batch was still running at the end (its worker is left
  // behind: exit the process rather than destroy the server). Idempotent.
  bool Drain(absl::Duration grace);

  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }
  ServerMetrics& metrics() { return *metrics_; }
  const model::StepRunner& model() const { return *runner_; }
  batching::BatcherStats batcher_stats() const { return batcher_->stats(); }
  ServiceCounts service_counts() const { return service_->counts(); }

 private:
  explicit PraxisServer(ServerOptions options, std::unique_ptr<model::StepRunner> runner);
  absl::Status Start();
  v1::ModelInfo Info() const;

  const ServerOptions options_;
  std::unique_ptr<model::StepRunner> runner_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<AnswerPipeline> answers_;  // null without answer_pipeline; outlives batcher_
  std::unique_ptr<batching::Batcher> batcher_;
  std::unique_ptr<PraxisService> service_;
  std::shared_ptr<const TokenAuthenticator> auth_;  // null: no authentication
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<bool> drained_{false};
};

}  // namespace praxis::serve
