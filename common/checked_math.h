#pragma once

// Arithmetic that cannot wrap, for every size, count or offset computed from untrusted input
// (wire tensors, config.json, a safetensors header): refuse before allocating.

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace praxis {

// a * b, or nullopt when it does not fit in int64_t.
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or nullopt when it does not fit in int64_t.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of `factors`, all of which must be >= 0, or nullopt for a negative factor or a
// product beyond `limit` (INT64_MAX by default). A zero factor does not hide an overflow in the
// others: [0, 2^40, 2^40] is refused, since a shape like that is never a real request.
inline std::optional<int64_t> CheckedProduct(absl::Span<const int64_t> factors,
                                             int64_t limit = INT64_MAX) {
  int64_t product = 1;
  bool zero = false;
  for (int64_t f : factors) {
    if (f < 0) return std::nullopt;
    if (f == 0) {
      zero = true;
      continue;
    }
    std::optional<int64_t> p = CheckedMul(product, f);
    if (!p || *p > limit) return std::nullopt;
    product = *p;
  }
  return zero ? 0 : product;
}

inline std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors,
                                             int64_t limit = INT64_MAX) {
  return CheckedProduct(absl::MakeConstSpan(factors.begin(), factors.size()), limit);
}

// CheckedProduct, or InvalidArgument "`field`: expected a product of [...] within `limit`".
inline absl::StatusOr<int64_t> CheckedProductOr(absl::Span<const int64_t> factors,
                                                absl::string_view field,
                                                int64_t limit = INT64_MAX) {
  if (std::optional<int64_t> p = CheckedProduct(factors, limit)) return *p;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected non-negative sizes whose product is at most ", limit,
                   ", got [", absl::StrJoin(factors, ", "), "]"));
}

}  // namespace praxis
