#include "server/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "model/step_validation.h"
#include "server/batch_runner.h"
#include "wire/output_names.h"
#include "wire/synthetic.h"

namespace praxis::serve {
namespace {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& o) {
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls_cert and tls_key: expected both or neither");
  }
  if (o.tls_cert_file.empty()) {
    if (!o.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("tls_client_ca: expected tls_cert and tls_key with it");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  PRAXIS_ASSIGN_OR_RETURN(pair.cert_chain, ReadFileToString(o.tls_cert_file));
  PRAXIS_ASSIGN_OR_RETURN(pair.private_key, ReadFileToString(o.tls_key_file));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!o.tls_client_ca_file.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFileToString(o.tls_client_ca_file));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// Server reflection on one ServerBuilder, or none. Linking grpc++_reflection registers its plugin
// for every server of the process (a static initializer), so switching it off means removing that
// plugin from this builder's list; switching it on keeps exactly one.
class ReflectionOption final : public grpc::ServerBuilderOption {
 public:
  explicit ReflectionOption(bool enabled) : enabled_(enabled) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    std::erase_if(*plugins, [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
      return dynamic_cast<grpc::reflection::ProtoServerReflectionPlugin*>(p.get()) != nullptr;
    });
    if (enabled_) {
      plugins->push_back(std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>());
    }
  }

 private:
  const bool enabled_;
};

}  // namespace

PraxisServer::PraxisServer(ServerOptions options, std::unique_ptr<model::StepRunner> runner)
    : options_(std::move(options)), runner_(std::move(runner)) {}

absl::StatusOr<std::unique_ptr<PraxisServer>> PraxisServer::Create(
    ServerOptions options, std::unique_ptr<model::StepRunner> runner) {
  std::unique_ptr<PraxisServer> s(new PraxisServer(std::move(options), std::move(runner)));
  PRAXIS_RETURN_IF_ERROR(s->Start());
  return s;
}

absl::Status PraxisServer::Start() {
  PRAXIS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> creds, Credentials(options_));
  if (!options_.auth_token_file.empty()) {
    PRAXIS_ASSIGN_OR_RETURN(auth_, TokenAuthenticator::Create(options_.auth_token_file));
  }
  metrics_ = std::make_unique<ServerMetrics>(options_.model, [this] {
    const batching::BatcherStats b = batcher_->stats();
    const ServiceCounts s = service_->counts();
    return LiveValues{b.queued_requests,
                      b.queued_bytes,
                      runner_->mask_cache_stats(),
                      runner_->text_cache_stats(),
                      runner_->device_memory_bytes(),
                      runner_->graph_stats(),
                      runner_->intra_op_threads(),
                      s.pending_response_bytes,
                      s.session_text_bytes,
                      s.write_timeouts,
                      batcher_->HeldBatchRows()};
  });
  if (options_.answer_pipeline) {
    // Worth a hand-off only when the worker has another batch to start.
    answers_ =
        std::make_unique<AnswerPipeline>([this] { return batcher_->stats().queued_requests > 0; });
  }
  batcher_ = std::make_unique<batching::Batcher>(
      options_.batch,
      [this](std::vector<std::unique_ptr<batching::Task>> batch, int shares) {
        return RunStepBatch(*runner_, *metrics_, std::move(batch), shares, answers_.get());
      },
      options_.workers);
  ServiceOptions service = options_.service;
  service.auth = auth_;
  service_ = std::make_unique<PraxisService>(std::move(service), runner_->config(), *batcher_,
                                             *metrics_, Info());
  // Scrapes read the batcher and the service: expose only once both exist.
  if (!options_.metrics_address.empty()) {
    PRAXIS_RETURN_IF_ERROR(metrics_->Expose(options_.metrics_address));
  }
  // Our own health service, which can require the token: gRPC's default one must not also be
  // registered (the switch is process-wide, and off unless something turned it on).
  grpc::EnableDefaultHealthCheckService(false);
  // Known by name too, so that probes may ask for the service or for the whole server ("").
  health_ =
      std::make_unique<HealthService>(std::vector<std::string>{"", v1::Praxis::service_full_name()},
                                      options_.auth_exempt_health ? nullptr : auth_.get());
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<ReflectionOption>(options_.reflection));
  builder.AddListeningPort(options_.address, creds, &port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(options_.max_message_bytes, std::numeric_limits<int>::max())));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_streams_per_connection);
  grpc::ResourceQuota quota("praxis-server");
  quota.Resize(static_cast<size_t>(options_.request_memory_bytes));
  builder.SetResourceQuota(quota);
  builder.RegisterService(service_.get());
  builder.RegisterService(health_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.address));
  }
  metrics_->SetServing(false);
  return absl::OkStatus();
}

PraxisServer::~PraxisServer() {
  if (server_) Drain(absl::ZeroDuration());
}

v1::ModelInfo PraxisServer::Info() const {
  v1::ModelInfo info;
  info.set_config_json(options_.config_json);
  info.set_dtype(runner_->dtype());
  info.set_device(runner_->device());
  info.set_model(options_.model.model);
  info.set_compute(options_.compute);
  const StepLimits& l = options_.service.limits;
  info.set_max_batch_rows(options_.batch.max_batch_rows);
  info.set_max_request_rows(l.max_rows);
  info.set_max_text_len(l.max_text_len);
  info.set_max_grid_h(l.max_grid_h);
  info.set_max_grid_w(l.max_grid_w);
  info.set_max_frames(l.max_frames);
  info.set_max_tokens(l.max_tokens);
  info.set_max_chunk_bytes(options_.service.max_chunk_bytes);
  info.set_max_request_gflop(l.max_request_gflop);
  info.set_max_response_bytes(l.max_response_bytes);
  info.set_max_message_bytes(options_.max_message_bytes);
  info.set_max_session_text_bytes(options_.service.max_session_text_bytes);
  info.set_max_abs_input(l.max_abs_input);
  for (const char* o : {wire::kVelocity, wire::kCond, wire::kEmbeddings, wire::kPositions}) {
    info.add_outputs(o);
  }
  for (size_t i = 0; i < runner_->config().encoder.tap_blocks.size(); ++i) {
    info.add_outputs(wire::TapName(static_cast<int>(i)));
  }
  info.set_text_dim(runner_->config().text_dim);
  info.set_latent_channels(runner_->config().latent_channels());
  return info;
}

absl::Status PraxisServer::Warmup(absl::Span<const WarmupStep> steps) {
  std::vector<model::StepInputs> inputs;
  for (const WarmupStep& step : steps) {
    inputs.push_back(
        wire::SyntheticInputs(runner_->config().step_dims(), step.layout, step.rows, /*seed=*/0));
    // The runner takes validated steps only; a layout from a flag may be out of the model's range.
    PRAXIS_RETURN_IF_ERROR(model::ValidateStep(runner_->config(), inputs.back()));
  }
  // On a thread of its own that then exits: the OpenMP team the warm-up grows goes with it, and
  // the batcher's worker stays the only thread holding one (model/cpu_runtime.h).
  absl::Status warm;
  const auto all =
      model::OutputSelection::All(static_cast<int>(runner_->config().encoder.tap_blocks.size()));
  std::thread([&] {
    for (const model::StepInputs& in : inputs) {
      warm = runner_->Run(in, all).status();
      if (!warm.ok()) return;
    }
  }).join();
  PRAXIS_RETURN_IF_ERROR(warm);
  if (drained_) return absl::OkStatus();
  service_->SetAccepting(true);
  health_->SetServing(true);
  metrics_->SetServing(true);
  return absl::OkStatus();
}

bool PraxisServer::Drain(absl::Duration grace) {
  if (drained_.exchange(true)) return true;
  const absl::Time end = absl::Now() + grace;
  // The last phase cancels what is left; the one before lets computed answers reach readers.
  const absl::Duration cancel = std::min(grace / 10, absl::Seconds(1));
  const absl::Duration writes = std::min(grace / 4, absl::Seconds(5));
  metrics_->SetServing(false);
  health_->Shutdown();  // NOT_SERVING, and it stays so; Watch streams end
  service_->StartDrain();
  const bool batches_done = batcher_->Drain(end - cancel - writes - absl::Now());
  if (answers_) answers_->Flush();  // the batches' answers the pipeline took
  service_->WaitForAnswers(end - cancel);
  server_->Shutdown(absl::ToChronoTime(end));
  server_->Wait();
  return batches_done;
}

}  // namespace praxis::serve
