#pragma once

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace praxis::serve {

// The one mapping from absl::Status to grpc::Status at the edge: the canonical codes are the same
// numbers in both, and the message is kept.
inline grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace praxis::serve
