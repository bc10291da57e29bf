#include "wire/dtype_names.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace praxis::wire {
namespace {

constexpr std::pair<const char*, torch::ScalarType> kDtypes[] = {
    {"float32", torch::kFloat32}, {"bfloat16", torch::kBFloat16}, {"float16", torch::kFloat16}};

}  // namespace

absl::StatusOr<torch::ScalarType> ParseDtype(const std::string& name) {
  for (const auto& [n, dtype] : kDtypes) {
    if (name == n) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype must be float32, bfloat16 or float16, got \"", name, "\""));
}

std::string DtypeName(torch::ScalarType dtype) {
  for (const auto& [n, d] : kDtypes) {
    if (dtype == d) return n;
  }
  return c10::toString(dtype);
}

}  // namespace praxis::wire
