#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/config.h"
#include "praxis/v1/praxis.grpc.pb.h"
#include "server/auth.h"
#include "server/batching/batcher.h"
#include "server/metrics.h"
#include "server/step_request.h"
#include "server/step_task.h"

namespace praxis::serve {

// Knobs of PraxisService.
struct ServiceOptions {
  int64_t max_chunk_bytes = 1 << 20;  // of each TensorChunk's data
  StepLimits limits;
  std::shared_ptr<const TokenAuthenticator> auth;  // null: calls need no token
};

class SessionReactor;

// Steps accepted into the batcher, and steps whose answer was written in full. After a drain the
// two are equal unless a client went away or the model failed.
struct ServiceCounts {
  int64_t accepted = 0;
  int64_t answered_ok = 0;
};

// praxis.v1.Praxis on gRPC's callback API. Each step is validated in its reaction (nothing invalid
// is queued), queued on the batcher, and answered from the batcher worker by a write chain with
// one write in flight; reactions never block.
//
// Thread-safe. Does not own the batcher or the metrics, which must outlive it; the server shuts
// gRPC down (which waits for every reactor) before destroying it.
class PraxisService final : public v1::Praxis::CallbackService {
 public:
  PraxisService(ServiceOptions options, const model::BackboneConfig& config,
                batching::Batcher& batcher, ServerMetrics& metrics, v1::ModelInfo info);
  ~PraxisService() override;

  // Steps are refused UNAVAILABLE until this is set (after warm-up).
  void SetAccepting(bool accepting);
  // Refuses new steps UNAVAILABLE from now on, and ends each session once its current step is
  // answered (idle sessions at once) with UNAVAILABLE, so that clients reconnect elsewhere.
  void StartDrain();

  grpc::ServerWriteReactor<v1::StepResponse>* Step(grpc::CallbackServerContext* ctx,
                                                   const v1::StepRequest* request) override;
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::ModelInfoRequest* request,
                                         v1::ModelInfo* info) override;

  // For the reactors: decodes `request` and queues it. `done` receives the one final answer:
  // at once, on this thread, when the step is refused (not accepting, invalid, queue full), else
  // later on a batcher worker. `plan` is set to what to send before the step is queued.
  void Submit(const v1::StepRequest& request, absl::Time deadline,
              std::shared_ptr<const std::atomic<bool>> cancelled, StepTask::Done done,
              OutputPlan* plan);
  const ServiceOptions& options() const { return options_; }
  ServerMetrics& metrics() { return metrics_; }
  bool draining() const { return draining_.load(); }

  // Called by a reactor when it has written a whole answer.
  void CountAnsweredOk() { ++answered_ok_; }
  ServiceCounts counts() const { return {accepted_.load(), answered_ok_.load()}; }

  // OK without a token file; else the token check of `ctx`, its failures counted for `method`.
  absl::Status Authenticate(const grpc::CallbackServerContext& ctx, absl::string_view method);

  // Sessions register so that StartDrain can end them.
  void AddSession(std::weak_ptr<SessionReactor> s);

 private:
  const ServiceOptions options_;
  const model::BackboneConfig& config_;
  batching::Batcher& batcher_;
  ServerMetrics& metrics_;
  const v1::ModelInfo info_;
  std::atomic<bool> accepting_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> answered_ok_{0};
  absl::Mutex sessions_mu_;
  std::vector<std::weak_ptr<SessionReactor>> sessions_ ABSL_GUARDED_BY(sessions_mu_);
};

}  // namespace praxis::serve
