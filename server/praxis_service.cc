#include "server/praxis_service.h"

#include <chrono>
#include <optional>
#include <utility>

#include "server/grpc_status.h"
#include "server/refused_reactor.h"
#include "server/step_response.h"

namespace praxis::serve {
namespace {

absl::Time CallDeadline(const grpc::CallbackServerContext* ctx) {
  const auto d = ctx->deadline();
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

}  // namespace

// One Step call: submit in the constructor, then a write chain from the batcher worker's answer.
// Owns itself; deleted in OnDone.
class StepReactor final : public grpc::ServerWriteReactor<v1::StepResponse> {
 public:
  StepReactor(PraxisService* service, grpc::CallbackServerContext* ctx,
              const v1::StepRequest* request)
      : service_(service), request_id_(request->request_id()) {
    service_->metrics().AddReceivedBytes(static_cast<int64_t>(request->ByteSizeLong()));
    service_->Submit(
        *request, CallDeadline(ctx), cancelled_,
        [this](absl::StatusOr<StepResult> r) { OnResult(std::move(r)); }, &plan_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(absl::CancelledError("the client went away mid-stream"));
    WriteNext();
  }
  void OnCancel() override { cancelled_->store(true); }
  void OnDone() override { delete this; }

 private:
  void OnResult(absl::StatusOr<StepResult> r) {
    if (!r.ok()) return End(r.status());
    absl::StatusOr<StepResponder> responder = StepResponder::Create(
        *r, plan_, request_id_, accepted_, service_->options().max_chunk_bytes);
    if (!responder.ok()) return End(responder.status());
    responder_.emplace(std::move(*responder));
    WriteNext();
  }

  void WriteNext() {
    if (!responder_->Next(&msg_)) return End(absl::OkStatus());
    service_->metrics().AddSentBytes(static_cast<int64_t>(msg_.ByteSizeLong()));
    StartWrite(&msg_);
  }

  void End(const absl::Status& s) {
    service_->metrics().CountRequest("Step", s.code());
    if (s.ok()) {
      service_->metrics().ObserveLatency("Step", absl::Now() - accepted_);
      service_->CountAnsweredOk();
    }
    Finish(ToGrpcStatus(s));
  }

  PraxisService* const service_;
  const absl::Time accepted_ = absl::Now();
  const std::string request_id_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  OutputPlan plan_;
  std::optional<StepResponder> responder_;
  v1::StepResponse msg_;
};

// One Session: read a step, submit it, write its answer (or a StepError), read the next. One step
// at a time, so answers come in request order. Owned by `self_` (and briefly by a draining
// service); released in OnDone.
//
// mu_ guards the state that StartDrain reads from another thread. gRPC operations are started
// outside it, except TryCancel.
class SessionReactor final : public grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse> {
 public:
  SessionReactor(PraxisService* service, grpc::CallbackServerContext* ctx)
      : service_(service), ctx_(ctx), deadline_(CallDeadline(ctx)) {}

  void Start(std::shared_ptr<SessionReactor> self) {
    self_ = std::move(self);
    ReadNext();
  }

  // Ends the session after its current step; an idle one (waiting for a request) is cancelled.
  void RequestStop() {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    if (reading_ && !done_) ctx_->TryCancel();
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
    }
    if (!ok) return End(absl::OkStatus());  // the client closed its side (or the call ended)
    if (service_->draining()) return End(absl::UnavailableError("server is draining; reconnect"));
    service_->metrics().AddReceivedBytes(static_cast<int64_t>(request_.ByteSizeLong()));
    step_start_ = absl::Now();
    service_->Submit(
        request_, deadline_, cancelled_,
        [this](absl::StatusOr<StepResult> r) { OnResult(std::move(r)); }, &plan_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return End(absl::CancelledError("the client went away mid-stream"));
    if (!responder_) return ReadNext();  // a StepError was written
    WriteNext();
  }
  void OnCancel() override { cancelled_->store(true); }
  void OnDone() override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    self_.reset();  // may delete this
  }

 private:
  void OnResult(absl::StatusOr<StepResult> r) {
    if (!r.ok()) return WriteError(r.status());
    absl::StatusOr<StepResponder> responder = StepResponder::Create(
        *r, plan_, request_.request_id(), step_start_, service_->options().max_chunk_bytes);
    if (!responder.ok()) return WriteError(responder.status());
    responder_.emplace(std::move(*responder));
    WriteNext();
  }

  void WriteNext() {
    if (responder_->Next(&msg_)) {
      service_->metrics().AddSentBytes(static_cast<int64_t>(msg_.ByteSizeLong()));
      return StartWrite(&msg_);
    }
    responder_.reset();
    service_->CountAnsweredOk();
    service_->metrics().CountRequest("Session", absl::StatusCode::kOk);
    service_->metrics().ObserveLatency("Session", absl::Now() - step_start_);
    ReadNext();
  }

  void WriteError(const absl::Status& s) {
    service_->metrics().CountRequest("Session", s.code());
    msg_.Clear();
    v1::StepError* e = msg_.mutable_error();
    e->set_code(static_cast<int32_t>(s.code()));
    e->set_message(std::string(s.message()));
    e->set_request_id(request_.request_id());
    StartWrite(&msg_);
  }

  void ReadNext() {
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      stop = stop_;
      reading_ = !stop;
    }
    if (stop) return End(absl::UnavailableError("server is draining; reconnect"));
    StartRead(&request_);
  }

  void End(const absl::Status& s) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(ToGrpcStatus(s));
  }

  PraxisService* const service_;
  grpc::CallbackServerContext* const ctx_;
  const absl::Time deadline_;
  std::shared_ptr<SessionReactor> self_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  v1::StepRequest request_;
  absl::Time step_start_;
  OutputPlan plan_;
  std::optional<StepResponder> responder_;
  v1::StepResponse msg_;
  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

PraxisService::PraxisService(ServiceOptions options, const model::BackboneConfig& config,
                             batching::Batcher& batcher, ServerMetrics& metrics, v1::ModelInfo info)
    : options_(std::move(options)),
      config_(config),
      batcher_(batcher),
      metrics_(metrics),
      info_(std::move(info)) {}

PraxisService::~PraxisService() = default;

void PraxisService::SetAccepting(bool accepting) { accepting_ = accepting; }

void PraxisService::StartDrain() {
  draining_ = true;
  std::vector<std::shared_ptr<SessionReactor>> live;
  {
    absl::MutexLock lock(&sessions_mu_);
    for (const auto& w : sessions_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (const auto& s : live) s->RequestStop();
}

absl::Status PraxisService::Authenticate(const grpc::CallbackServerContext& ctx,
                                         absl::string_view method) {
  if (options_.auth == nullptr) return absl::OkStatus();
  absl::Status s = options_.auth->Check(ctx);
  if (!s.ok()) metrics_.CountRequest(method, s.code());
  return s;
}

void PraxisService::AddSession(std::weak_ptr<SessionReactor> s) {
  absl::MutexLock lock(&sessions_mu_);
  std::erase_if(sessions_, [](const auto& w) { return w.expired(); });
  sessions_.push_back(std::move(s));
}

void PraxisService::Submit(const v1::StepRequest& request, absl::Time deadline,
                           std::shared_ptr<const std::atomic<bool>> cancelled, StepTask::Done done,
                           OutputPlan* plan) {
  if (draining_) return done(absl::UnavailableError("server is draining; retry elsewhere"));
  if (!accepting_) return done(absl::UnavailableError("server is warming up; retry shortly"));
  absl::StatusOr<DecodedStep> step = DecodeStepRequest(request, config_, options_.limits);
  if (!step.ok()) return done(step.status());
  *plan = step->outputs;
  std::unique_ptr<batching::Task> task =
      std::make_unique<StepTask>(*std::move(step), deadline, std::move(cancelled), std::move(done));
  ++accepted_;  // before Submit: the answer may come before it returns
  const absl::Status s = batcher_.Submit(task);
  if (!s.ok()) {
    --accepted_;
    static_cast<StepTask*>(task.get())->Complete(s);
  }
}

grpc::ServerWriteReactor<v1::StepResponse>* PraxisService::Step(grpc::CallbackServerContext* ctx,
                                                                const v1::StepRequest* request) {
  if (absl::Status s = Authenticate(*ctx, "Step"); !s.ok()) {
    return new RefusedReactor<grpc::ServerWriteReactor<v1::StepResponse>>(ToGrpcStatus(s));
  }
  return new StepReactor(this, ctx, request);
}

grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* PraxisService::Session(
    grpc::CallbackServerContext* ctx) {
  if (absl::Status s = Authenticate(*ctx, "Session"); !s.ok()) {
    using Bidi = grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>;
    return new RefusedReactor<Bidi>(ToGrpcStatus(s));
  }
  auto s = std::make_shared<SessionReactor>(this, ctx);
  AddSession(s);
  SessionReactor* raw = s.get();
  raw->Start(std::move(s));
  if (draining_) raw->RequestStop();
  return raw;
}

grpc::ServerUnaryReactor* PraxisService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                      const v1::ModelInfoRequest* request,
                                                      v1::ModelInfo* info) {
  if (absl::Status s = Authenticate(*ctx, "GetModelInfo"); !s.ok()) {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpcStatus(s));
    return r;
  }
  *info = info_;
  metrics_.CountRequest("GetModelInfo", absl::StatusCode::kOk);
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

}  // namespace praxis::serve
