#include "server/health_service.h"

#include <optional>
#include <tuple>
#include <utility>

#include "server/grpc_status.h"
#include "server/refused_reactor.h"

namespace praxis::serve {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch call: writes the status of its service whenever it changes, one write in flight; ends
// when the service shuts down or the client goes away. Owned by `self_` (and briefly by a
// notifying service); released in OnDone. mu_ guards the state that notifications from other
// threads change; gRPC operations are started outside it.
class HealthWatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  using ServingStatus = HealthService::ServingStatus;

  explicit HealthWatchReactor(std::string service) : service_(std::move(service)) {}
  void Start(std::shared_ptr<HealthWatchReactor> self) { self_ = std::move(self); }
  const std::string& service() const { return service_; }

  // The status of the service as of `version` (older versions than one seen are ignored, so a
  // late notification cannot undo a newer one); with `end`, the stream ends once it is written.
  void Notify(ServingStatus status, uint64_t version, bool end) {
    Advance([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!latest_ || version >= version_) {
        version_ = version;
        latest_ = status;
      }
      end_ = end_ || end;
    });
  }

  void OnWriteDone(bool ok) override {
    Advance([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      writing_ = false;
      cancelled_ = cancelled_ || !ok;
    });
  }
  void OnCancel() override {
    Advance([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { cancelled_ = true; });
  }
  void OnDone() override { self_.reset(); }  // may delete this

 private:
  enum class Action { kNone, kWrite, kFinish };

  // Applies `change` under the lock, then starts what the new state calls for.
  template <typename F>
  void Advance(F change) {
    Action action;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      change();
      action = NextLocked(&status);
    }
    if (action == Action::kWrite) StartWrite(&msg_);
    if (action == Action::kFinish) Finish(status);
  }

  Action NextLocked(grpc::Status* status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) return Action::kNone;
    if (cancelled_) {
      finished_ = true;
      *status = grpc::Status(grpc::StatusCode::CANCELLED, "the watch was cancelled");
      return Action::kFinish;
    }
    if (latest_ && latest_ != sent_) {
      msg_.set_status(*latest_);
      sent_ = latest_;
      writing_ = true;
      return Action::kWrite;
    }
    if (end_) {
      finished_ = true;
      *status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
      return Action::kFinish;
    }
    return Action::kNone;
  }

  const std::string service_;
  std::shared_ptr<HealthWatchReactor> self_;
  HealthCheckResponse msg_;  // written only while no write is in flight
  absl::Mutex mu_;
  std::optional<ServingStatus> latest_ ABSL_GUARDED_BY(mu_);
  std::optional<ServingStatus> sent_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool end_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::HealthService(const std::vector<std::string>& services,
                             const TokenAuthenticator* auth)
    : auth_(auth) {
  for (const std::string& s : services) statuses_[s] = HealthCheckResponse::NOT_SERVING;
}

HealthService::~HealthService() = default;

HealthService::ServingStatus HealthService::StatusOf(const std::string& service) const {
  const auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetServing(bool serving) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    for (auto& [name, status] : statuses_) {
      status = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
    }
    ++version_;
  }
  NotifyWatchers();
}

void HealthService::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    for (auto& [name, status] : statuses_) status = HealthCheckResponse::NOT_SERVING;
    ++version_;
  }
  NotifyWatchers();
}

void HealthService::NotifyWatchers() {
  std::vector<std::tuple<std::shared_ptr<HealthWatchReactor>, ServingStatus>> live;
  uint64_t version;
  bool end;
  {
    absl::MutexLock lock(&mu_);
    std::erase_if(watchers_, [](const auto& w) { return w.expired(); });
    for (const auto& w : watchers_) {
      if (auto r = w.lock()) live.emplace_back(r, StatusOf(r->service()));
    }
    version = version_;
    end = shut_down_;
  }
  for (const auto& [r, status] : live) r->Notify(status, version, end);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  if (auth_ != nullptr) {
    if (const absl::Status s = auth_->Check(*ctx); !s.ok()) {
      r->Finish(ToGrpcStatus(s));
      return r;
    }
  }
  ServingStatus status;
  {
    absl::MutexLock lock(&mu_);
    status = StatusOf(request->service());
  }
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    r->Finish(
        grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service '" + request->service() + "'"));
    return r;
  }
  response->set_status(status);
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* ctx, const HealthCheckRequest* request) {
  if (auth_ != nullptr) {
    if (const absl::Status s = auth_->Check(*ctx); !s.ok()) {
      return new RefusedReactor<grpc::ServerWriteReactor<HealthCheckResponse>>(ToGrpcStatus(s));
    }
  }
  auto r = std::make_shared<HealthWatchReactor>(request->service());
  HealthWatchReactor* raw = r.get();
  raw->Start(r);
  ServingStatus status;
  uint64_t version;
  bool end;
  {
    absl::MutexLock lock(&mu_);
    std::erase_if(watchers_, [](const auto& w) { return w.expired(); });
    watchers_.push_back(r);
    status = StatusOf(request->service());
    version = version_;
    end = shut_down_;
  }
  raw->Notify(status, version, end);
  return raw;
}

}  // namespace praxis::serve
