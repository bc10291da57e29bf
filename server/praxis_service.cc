#include "server/praxis_service.h"

#include <chrono>
#include <exception>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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

// One step's answer chain, shared by both reactors: admission, the batcher's result turned into
// messages, each message written with the watchdog's clock running, and the metrics of the step.
// Not thread-safe: its reactor calls it from one reaction at a time.
class AnswerChain {
 public:
  AnswerChain(StepContext& ctx, grpc::ServerContextBase* call, const char* method)
      : ctx_(ctx), clock_(ctx.watchdog().Watch(call)), method_(method) {}

  // Starts a step; `done` receives its result (see StepContext::Submit).
  void Submit(const v1::StepRequest& request, absl::Time deadline,
              std::shared_ptr<const std::atomic<bool>> cancelled, StepTask::Done done,
              SessionText* session) {
    start_ = absl::Now();
    request_id_ = request.request_id();
    ctx_.metrics().AddReceivedBytes(static_cast<int64_t>(request.ByteSizeLong()));
    ctx_.Submit(request, deadline, std::move(cancelled), std::move(done), &admitted_, session);
  }

  // The batcher's result: OK once the first message is ready to write, else the step's error.
  absl::Status Start(absl::StatusOr<StepResult> r) {
    if (!r.ok()) return r.status();
    absl::StatusOr<StepResponder> responder =
        StepResponder::Create(*r, admitted_.plan, request_id_, start_,
                              ctx_.options().max_chunk_bytes, admitted_.text_kept);
    if (!responder.ok()) return responder.status();
    responder_.emplace(*std::move(responder));
    return absl::OkStatus();
  }

  // The next message in `msg` (true), or false when the answer is complete; an encoding error
  // ends the step. The watchdog's clock runs from here until WriteDone.
  absl::StatusOr<bool> Next(v1::StepResponse* msg) {
    absl::StatusOr<bool> more = responder_->Next(msg);
    if (more.ok() && *more) {
      ctx_.metrics().AddSentBytes(static_cast<int64_t>(msg->ByteSizeLong()));
      clock_->WriteStarted();
    }
    return more;
  }
  // Whether the message Next just filled is the answer's last.
  bool last() const { return responder_.has_value() && responder_->finished(); }
  void WriteDone() { clock_->WriteDone(); }
  void CallDone() { clock_->CallDone(); }
  // gRPC cancelled the call; a queued step sees it through its `cancelled` flag.
  void Cancelled() { ctx_.CountCancelledCall(); }

  // Ends the step: its metrics, and the answer's budget released.
  void Finish(const absl::Status& s) {
    ctx_.metrics().CountRequest(method_, s.code());
    if (s.ok()) {
      ctx_.metrics().ObserveLatency(method_, absl::Now() - start_);
      ctx_.CountAnsweredOk();
    }
    responder_.reset();
    admitted_ = Admission();
  }

  bool answering() const { return responder_.has_value(); }
  const std::string& request_id() const { return request_id_; }

 private:
  StepContext& ctx_;
  const std::shared_ptr<WriteWatchdog::Clock> clock_;
  const char* const method_;
  absl::Time start_;
  std::string request_id_;
  Admission admitted_;
  std::optional<StepResponder> responder_;
};

// One Step call: submit in the constructor, then a write chain from the batcher worker's answer.
// Owns itself; deleted in OnDone.
class StepReactor final : public grpc::ServerWriteReactor<v1::StepResponse> {
 public:
  StepReactor(StepContext& service, grpc::CallbackServerContext* ctx,
              const v1::StepRequest* request)
      : chain_(service, ctx, "Step") {
    // While the step computes, not with the header's write after it: one send fewer between the
    // model's result and the client.
    StartSendInitialMetadata();
    chain_.Submit(
        *request, CallDeadline(ctx), cancelled_,
        [this](absl::StatusOr<StepResult> r) { OnResult(std::move(r)); }, nullptr);
  }

  void OnWriteDone(bool ok) override {
    chain_.WriteDone();
    if (!ok) return End(absl::CancelledError("the client went away mid-stream"));
    WriteNext();
  }
  void OnCancel() override {
    cancelled_->store(true);
    chain_.Cancelled();
  }
  void OnDone() override {
    chain_.CallDone();
    delete this;
  }

 private:
  void OnResult(absl::StatusOr<StepResult> r) {
    const absl::Status s = chain_.Start(std::move(r));
    if (!s.ok()) return End(s);
    WriteNext();
  }

  void WriteNext() {
    absl::StatusOr<bool> more = chain_.Next(&msg_);
    if (!more.ok()) return End(more.status());
    if (!*more) return End(absl::OkStatus());
    if (chain_.last()) {
      // The trailer and the call's status in one operation: no reaction waited on between them.
      chain_.Finish(absl::OkStatus());
      return StartWriteAndFinish(&msg_, grpc::WriteOptions(), grpc::Status::OK);
    }
    StartWrite(&msg_);
  }

  void End(const absl::Status& s) {
    chain_.Finish(s);
    Finish(ToGrpcStatus(s));
  }

  AnswerChain chain_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  v1::StepResponse msg_;
};

// One Session: read a step, submit it, write its answer (or a StepError), read the next. One step
// at a time, so answers come in request order, and a read and a write are never in flight
// together. Owned by `self_` (and briefly by a draining service); released in OnDone.
//
// mu_ guards the state that RequestStop reads from another thread; gRPC operations are started
// outside it, and so are the watchdog clock's methods (see WriteWatchdog::Clock).
class SessionReactor final : public grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse> {
 public:
  SessionReactor(StepContext& service, grpc::CallbackServerContext* ctx)
      : service_(service), chain_(service, ctx, "Session"), deadline_(CallDeadline(ctx)) {}

  void Start(std::shared_ptr<SessionReactor> self) {
    self_ = std::move(self);
    ReadNext();
  }

  // Ends the session with UNAVAILABLE after its current step; an idle one (waiting for a request)
  // at once: finishing with a read pending is allowed, and the read then fails.
  void RequestStop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      // Claimed under the lock that OnReadDone takes, so a request read meanwhile is dropped
      // rather than answered after the call is finished.
      if (!reading_ || finished_) return;
      finished_ = true;
    }
    Finish(ToGrpcStatus(Draining()));
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (finished_) return;  // RequestStop ended the session while this read was pending
    }
    if (!ok) return End(absl::OkStatus());  // the client closed its side (or the call ended)
    if (service_.draining()) return End(Draining());
    // Taken out of request_, so that an idle session holds its decoded text at most, not the
    // message's bytes too, and the next read (possibly started on another thread before Submit
    // returns) fills a message nothing else touches.
    const v1::StepRequest request = std::move(request_);
    chain_.Submit(
        request, deadline_, cancelled_,
        [this](absl::StatusOr<StepResult> r) { OnResult(std::move(r)); }, &text_);
  }

  void OnWriteDone(bool ok) override {
    chain_.WriteDone();
    if (!ok) {
      if (chain_.answering()) chain_.Finish(absl::CancelledError("the client went away"));
      return End(absl::CancelledError("the client went away mid-stream"));
    }
    if (!chain_.answering()) return ReadNext();  // a StepError was written
    WriteNext();
  }
  void OnCancel() override {
    cancelled_->store(true);
    chain_.Cancelled();
  }
  void OnDone() override {
    chain_.CallDone();
    self_.reset();  // may delete this
  }

 private:
  static absl::Status Draining() { return absl::UnavailableError("server is draining; reconnect"); }

  void OnResult(absl::StatusOr<StepResult> r) {
    const absl::Status s = chain_.Start(std::move(r));
    if (!s.ok()) return WriteError(s);
    WriteNext();
  }

  void WriteNext() {
    absl::StatusOr<bool> more = chain_.Next(&msg_);
    if (!more.ok()) return WriteError(more.status());  // the header may be out: the error ends it
    if (*more) return StartWrite(&msg_);
    chain_.Finish(absl::OkStatus());
    ReadNext();
  }

  void WriteError(const absl::Status& s) {
    chain_.Finish(s);
    msg_.Clear();
    v1::StepError* e = msg_.mutable_error();
    e->set_code(static_cast<int32_t>(s.code()));
    e->set_message(std::string(s.message()));
    e->set_request_id(chain_.request_id());
    StartWrite(&msg_);
  }

  void ReadNext() {
    bool stop;
    {
      absl::MutexLock lock(&mu_);
      stop = stop_;
      reading_ = !stop;
    }
    if (stop) return End(Draining());
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

  StepContext& service_;
  AnswerChain chain_;
  const absl::Time deadline_;
  std::shared_ptr<SessionReactor> self_;
  const std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  v1::StepRequest request_;
  v1::StepResponse msg_;
  SessionText text_;  // touched only in Submit, before the step is queued
  absl::Mutex mu_;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

PraxisService::PraxisService(ServiceOptions options, const model::BackboneConfig& config,
                             batching::Batcher& batcher, ServerMetrics& metrics, v1::ModelInfo info)
    : options_(std::move(options)),
      config_(config),
      batcher_(batcher),
      metrics_(metrics),
      info_(std::move(info)),
      pending_(options_.max_pending_response_bytes, "--max_pending_response_bytes",
               "answers held for slow readers"),
      session_texts_(options_.max_session_text_bytes, "--max_session_text_bytes",
                     "texts kept by sessions"),
      watchdog_(options_.write_timeout) {}

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

bool PraxisService::WaitForAnswers(absl::Time deadline) { return pending_.AwaitEmpty(deadline); }

ServiceCounts PraxisService::counts() const {
  return {accepted_.load(),        answered_ok_.load(), watchdog_.cancelled(),
          cancelled_calls_.load(), pending_.used(),     session_texts_.used()};
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

bool PraxisService::KeepText(const torch::Tensor& text, SessionText& session) {
  absl::StatusOr<ByteBudget::Reservation> held = session_texts_.Reserve(text.nbytes());
  if (!held.ok()) return false;
  session.held = *std::move(held);
  session.text = text;
  return true;
}

absl::Status PraxisService::Admit(const v1::StepRequest& request, absl::Time deadline,
                                  std::shared_ptr<const std::atomic<bool>> cancelled,
                                  StepTask::Done& done, Admission* admitted, SessionText* session) {
  if (draining_) return absl::UnavailableError("server is draining; retry elsewhere");
  if (!accepting_) return absl::UnavailableError("server is warming up; retry shortly");
  const bool reuse = session != nullptr && !request.has_text();
  if (session != nullptr && !reuse) {
    // Replaced by this step's text if it is admitted, else by none: never an older text for a
    // later step that leaves its own out.
    session->held.Release();
    session->text = torch::Tensor();
  }
  if (reuse && !session->text.defined()) {
    return absl::InvalidArgumentError(
        "text: expected a tensor, got none (a Session step may leave text out only after an "
        "answer whose header said text_kept)");
  }
  PRAXIS_ASSIGN_OR_RETURN(DecodedStep step,
                          DecodeStepRequest(request, config_, options_.limits,
                                            reuse ? session->text : torch::Tensor()));
  absl::StatusOr<ByteBudget::Reservation> answer = pending_.Reserve(step.outputs.response_bytes);
  if (!answer.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(answer.status().message(), "; not computed, retry later"));
  }
  admitted->reservation = *std::move(answer);
  admitted->plan = step.outputs;
  admitted->text_kept = session != nullptr && (reuse || KeepText(step.inputs.text, *session));
  std::unique_ptr<batching::Task> task =
      std::make_unique<StepTask>(std::move(step), deadline, std::move(cancelled), std::move(done));
  done = nullptr;  // the task answers from now on
  ++accepted_;     // before Submit: the answer may come before it returns
  absl::Status s = batcher_.Submit(task);
  if (!s.ok()) {
    --accepted_;
    // The task was handed back: answer through it, as the caller's `done` now lives there.
    admitted->reservation.Release();
    static_cast<StepTask*>(task.get())->Complete(std::move(s));
  }
  return absl::OkStatus();
}

void PraxisService::Submit(const v1::StepRequest& request, absl::Time deadline,
                           std::shared_ptr<const std::atomic<bool>> cancelled, StepTask::Done done,
                           Admission* admitted, SessionText* session) {
  absl::Status s;
  try {  // the torch boundary: no exception may escape a reaction
    s = Admit(request, deadline, std::move(cancelled), done, admitted, session);
  } catch (const std::exception& e) {
    s = absl::InternalError(absl::StrCat("admitting the step: ", e.what()));
  }
  if (!s.ok() && done) done(s);  // refused before a task took `done` over
}

grpc::ServerWriteReactor<v1::StepResponse>* PraxisService::Step(grpc::CallbackServerContext* ctx,
                                                                const v1::StepRequest* request) {
  if (absl::Status s = Authenticate(*ctx, "Step"); !s.ok()) {
    return new RefusedReactor<grpc::ServerWriteReactor<v1::StepResponse>>(ToGrpcStatus(s));
  }
  return new StepReactor(*this, ctx, request);
}

grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* PraxisService::Session(
    grpc::CallbackServerContext* ctx) {
  if (absl::Status s = Authenticate(*ctx, "Session"); !s.ok()) {
    using Bidi = grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>;
    return new RefusedReactor<Bidi>(ToGrpcStatus(s));
  }
  auto s = std::make_shared<SessionReactor>(static_cast<StepContext&>(*this), ctx);
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
