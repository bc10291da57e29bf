#pragma once

// Parsing of list-valued command-line flags, shared by the programs that take them.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace praxis {

// The comma-separated positive integers of flag `flag` ("1,8"), or InvalidArgument naming the
// flag and the entry that is not one. Thread-safe.
inline absl::StatusOr<std::vector<int64_t>> ParsePositiveInts(absl::string_view text,
                                                              absl::string_view flag) {
  std::vector<int64_t> values;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(entry, &n) || n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": expected positive integers separated by ',', got '", entry, "'"));
    }
    values.push_back(n);
  }
  return values;
}

}  // namespace praxis
