#include "wire/selection.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "wire/dtype_names.h"
#include "wire/output_names.h"
#include "wire/tensor_codec.h"

namespace praxis::wire {

absl::StatusOr<v1::DType> ParseWireDtype(const std::string& name) {
  const absl::StatusOr<torch::ScalarType> dtype = ParseDtype(name);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("wire dtype: expected float32, bfloat16 or float16, got \"", name, "\""));
  }
  return ToWireDtype(*dtype);
}

absl::StatusOr<v1::OutputSelection> ParseOutputs(const std::vector<std::string>& names) {
  v1::OutputSelection o;
  for (const std::string& n : names) {
    int tap = 0;
    if (n == kVelocity) {
      o.set_velocity(true);
    } else if (n == kCond) {
      o.set_cond(true);
    } else if (n == kAllTaps) {
      o.set_all_taps(true);
    } else if (absl::StartsWith(n, kTapPrefix) &&
               absl::SimpleAtoi(absl::string_view(n).substr(kTapPrefix.size()), &tap)) {
      o.add_taps(tap);
    } else if (n == kEmbeddings) {
      o.set_embeddings(true);
    } else if (n == kPositions) {
      o.set_positions(true);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs: expected velocity, cond, taps, tap.N, embeddings or positions, got \"", n,
          "\""));
    }
  }
  return o;
}

}  // namespace praxis::wire
