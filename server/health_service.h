#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/auth.h"

namespace praxis::serve {

class HealthWatchReactor;

// grpc.health.v1.Health on the callback API, in place of gRPC's DefaultHealthCheckService: ours
// can require the bearer token (gRPC 1.51 offers no way to authenticate a built-in service on a
// plaintext port). Check answers the status of a known service and NOT_FOUND otherwise; Watch
// streams each change (SERVICE_UNKNOWN for an unknown name) until Shutdown, which sends
// NOT_SERVING and ends every Watch, so that a watcher never holds Server::Shutdown up. Generated
// from proto/grpc/health/v1/health.proto, it brings that file's descriptor into the process, which
// server reflection needs to resolve grpc.health.v1.Health (tests/client/test_reflection.py).
//
// Thread-safe. Does not own `auth` (nullptr: no token needed), which must outlive it.
class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // `services` are the names Check knows ("" for the whole server); all start NOT_SERVING.
  HealthService(const std::vector<std::string>& services, const TokenAuthenticator* auth);
  ~HealthService() override;

  // Sets every known service SERVING or NOT_SERVING; ignored after Shutdown.
  void SetServing(bool serving);
  // Every service NOT_SERVING from now on; every Watch stream is sent that and ended.
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  ServingStatus StatusOf(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends the current statuses to the live watchers (called after each change).
  void NotifyWatchers();

  const TokenAuthenticator* const auth_;
  mutable absl::Mutex mu_;
  std::map<std::string, ServingStatus> statuses_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // bumped at each change; orders notifications
  std::vector<std::weak_ptr<HealthWatchReactor>> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace praxis::serve
