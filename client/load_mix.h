#pragma once

// praxis-load's --mix: weighted layouts (decode on or off) and the synthetic request of each.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/request_builder.h"
#include "praxis/v1/praxis.pb.h"
#include "wire/step_inputs.h"

namespace praxis::client {

// One kind of request of the mix.
struct MixEntry {
  std::string name;  // "text_len,h,w,K,F" or "…,enc" (decode off)
  double weight = 1;
  v1::StepRequest request;
};

// Parses `text` = ENTRY;ENTRY;… with ENTRY = text_len,h,w,K,F[,enc][*WEIGHT] into requests of
// `rows` rows of synthetic inputs of the model's `dims`, asking for `options`' outputs (velocity
// dropped for enc entries, cond asked when nothing is left). InvalidArgument naming --mix when
// malformed.
absl::StatusOr<std::vector<MixEntry>> ParseMix(const std::string& text, const wire::StepDims& dims,
                                               int64_t rows, const RequestOptions& options);

}  // namespace praxis::client
