#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Early-return helpers for absl::Status, the only error channel of praxis-serve's own code.

#define PRAXIS_STATUS_CONCAT_INNER_(a, b) a##b
#define PRAXIS_STATUS_CONCAT_(a, b) PRAXIS_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define PRAXIS_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status praxis_status_ = (expr);          \
    if (!praxis_status_.ok()) return praxis_status_; \
  } while (false)

// `lhs = value of expr` (an absl::StatusOr<T>), or returns its error.
#define PRAXIS_ASSIGN_OR_RETURN(lhs, expr) \
  PRAXIS_ASSIGN_OR_RETURN_IMPL_(PRAXIS_STATUS_CONCAT_(praxis_statusor_, __LINE__), lhs, expr)

#define PRAXIS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
