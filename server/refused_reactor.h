#pragma once

#include <grpcpp/grpcpp.h>

namespace praxis::serve {

// A callback reactor (any of gRPC's server reactor bases) that only finishes its call with
// `status`, for calls refused before any work starts (a missing or wrong token). Owns itself:
// deleted in OnDone.
template <typename Base>
class RefusedReactor final : public Base {
 public:
  explicit RefusedReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace praxis::serve
