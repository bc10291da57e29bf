#pragma once

// praxis.v1.Praxis on gRPC's callback API: admission (decode, validate, cost and answer budgets),
// queueing on the batcher, and the reactors that write each answer. The reactors themselves live
// in praxis_service.cc and see only the narrow StepContext below.

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
#include "server/byte_budget.h"
#include "server/metrics.h"
#include "server/step_request.h"
#include "server/step_task.h"
#include "server/write_watchdog.h"

namespace praxis::serve {

// Knobs of PraxisService.
struct ServiceOptions {
  int64_t max_chunk_bytes = 1 << 20;  // of each TensorChunk's data
  StepLimits limits;
  // Answer bytes admitted but not yet taken by their readers, all calls together; beyond it new
  // steps are refused RESOURCE_EXHAUSTED and never computed.
  int64_t max_pending_response_bytes = int64_t{1} << 30;
  // A call whose reader takes no data for this long is cancelled and its answer freed.
  absl::Duration write_timeout = absl::Seconds(30);
  // Text bytes kept for Session steps that leave text out, all sessions together; a session whose
  // text does not fit keeps none (its answers say text_kept = false) and must send text each step.
  int64_t max_session_text_bytes = int64_t{256} << 20;
  std::shared_ptr<const TokenAuthenticator> auth;  // null: calls need no token
};

class SessionReactor;

// Steps accepted into the batcher, and steps whose answer was written in full. After a drain the
// two are equal unless a client went away or the model failed.
struct ServiceCounts {
  int64_t accepted = 0;
  int64_t answered_ok = 0;
  int64_t write_timeouts = 0;          // calls cancelled for a stalled reader
  int64_t cancelled_calls = 0;         // calls gRPC cancelled: the client, a deadline or the above
  int64_t pending_response_bytes = 0;  // answer bytes held for readers now
  int64_t session_text_bytes = 0;      // texts kept by sessions now
};

// The text one Session keeps for steps that leave it out, and its share of
// --max_session_text_bytes. Owned by its session's reactor; used from one reaction at a time.
struct SessionText {
  torch::Tensor text;  // as decoded from the step that sent it; undefined: none kept
  ByteBudget::Reservation held;
};

// What Submit admitted for one step: what to send, and its share of the answer budget (held
// until the answer is written or abandoned).
struct Admission {
  OutputPlan plan;
  ByteBudget::Reservation reservation;
  bool text_kept = false;  // the session keeps the text this step used (StepHeader.text_kept)
};

// The part of the service a reactor uses: admission, the write watchdog, metrics and counts.
// Thread-safe.
class StepContext {
 public:
  virtual ~StepContext() = default;
  // Decodes `request` and queues it. `done` receives the one final answer: at once, on this
  // thread, when the step is refused (not accepting, invalid, over a budget, queue full), else
  // later on a batcher worker (possibly before Submit returns). `admitted` is filled before the
  // step is queued. `session` (null on a Step call) supplies a left-out text, and keeps a sent one
  // if the step is admitted (else none). Never throws.
  virtual void Submit(const v1::StepRequest& request, absl::Time deadline,
                      std::shared_ptr<const std::atomic<bool>> cancelled, StepTask::Done done,
                      Admission* admitted, SessionText* session) = 0;
  virtual const ServiceOptions& options() const = 0;
  virtual ServerMetrics& metrics() = 0;
  virtual WriteWatchdog& watchdog() = 0;
  virtual bool draining() const = 0;
  // Called by a reactor when it has written a whole answer.
  virtual void CountAnsweredOk() = 0;
  // Called by a reactor when gRPC cancels its call (the client, its deadline or the watchdog).
  virtual void CountCancelledCall() = 0;
};

// praxis.v1.Praxis. Each step is validated and costed in its reaction (nothing invalid or over
// budget is queued), queued on the batcher, and answered from the batcher worker by a write chain
// with one write in flight; reactions never block.
//
// Thread-safe. Does not own the batcher or the metrics, which must outlive it; the server shuts
// gRPC down (which waits for every reactor) before destroying it.
class PraxisService final : public v1::Praxis::CallbackService, private StepContext {
 public:
  PraxisService(ServiceOptions options, const model::BackboneConfig& config,
                batching::Batcher& batcher, ServerMetrics& metrics, v1::ModelInfo info);
  ~PraxisService() override;

  // Steps are refused UNAVAILABLE until this is set (after warm-up).
  void SetAccepting(bool accepting);
  // Refuses new steps UNAVAILABLE from now on, and ends each session with UNAVAILABLE once its
  // current step is answered (idle ones, and ones opened from now on, at once), so that clients
  // reconnect elsewhere.
  void StartDrain();
  // Waits until every admitted answer has been written or abandoned, or `deadline`; true if none
  // is left.
  bool WaitForAnswers(absl::Time deadline);

  grpc::ServerWriteReactor<v1::StepResponse>* Step(grpc::CallbackServerContext* ctx,
                                                   const v1::StepRequest* request) override;
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* Session(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::ModelInfoRequest* request,
                                         v1::ModelInfo* info) override;

  ServiceCounts counts() const;

 private:
  // StepContext.
  void Submit(const v1::StepRequest& request, absl::Time deadline,
              std::shared_ptr<const std::atomic<bool>> cancelled, StepTask::Done done,
              Admission* admitted, SessionText* session) override;
  const ServiceOptions& options() const override { return options_; }
  ServerMetrics& metrics() override { return metrics_; }
  WriteWatchdog& watchdog() override { return watchdog_; }
  bool draining() const override { return draining_.load(); }
  void CountAnsweredOk() override { ++answered_ok_; }
  void CountCancelledCall() override { ++cancelled_calls_; }

  absl::Status Admit(const v1::StepRequest& request, absl::Time deadline,
                     std::shared_ptr<const std::atomic<bool>> cancelled, StepTask::Done& done,
                     Admission* admitted, SessionText* session);
  // The decoded step's text kept for `session` if --max_session_text_bytes has room; whether it
  // was.
  bool KeepText(const torch::Tensor& text, SessionText& session);
  void AddSession(std::weak_ptr<SessionReactor> s);
  // OK without a token file; else the token check of `ctx`, its failures counted for `method`.
  absl::Status Authenticate(const grpc::CallbackServerContext& ctx, absl::string_view method);

  const ServiceOptions options_;
  const model::BackboneConfig& config_;
  batching::Batcher& batcher_;
  ServerMetrics& metrics_;
  const v1::ModelInfo info_;
  ByteBudget pending_;
  ByteBudget session_texts_;
  WriteWatchdog watchdog_;
  std::atomic<bool> accepting_{false};
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> answered_ok_{0};
  std::atomic<int64_t> cancelled_calls_{0};
  absl::Mutex sessions_mu_;
  std::vector<std::weak_ptr<SessionReactor>> sessions_ ABSL_GUARDED_BY(sessions_mu_);
};

}  // namespace praxis::serve
