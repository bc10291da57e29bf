#include "wire/layout_key.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace praxis::wire {

std::string LayoutKey(const StepGeometry& g, bool decode,
                      const std::array<int64_t, 4>& rope_shifts) {
  return absl::StrCat("L", g.text_len, "_a", g.anchor_h, "x", g.anchor_w, "_K", g.k, "_F", g.f,
                      "_g", g.h, "x", g.w, decode ? "_dec" : "_enc", "_rs",
                      absl::StrJoin(rope_shifts, ","));
}

std::string LayoutKey(const StepInputs& in) {
  return LayoutKey(GeometryOf(in), in.decode, in.rope_shifts);
}

absl::StatusOr<StepGeometry> ParseLayout(absl::string_view text, absl::string_view field) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  int64_t v[5];
  bool ok = parts.size() == 5;
  for (int i = 0; ok && i < 5; ++i) ok = absl::SimpleAtoi(parts[i], &v[i]) && v[i] >= 1;
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected five positive integers text_len,h,w,K,F, got \"", text, "\""));
  }
  return StepGeometry{.text_len = v[0],
                      .anchor_h = v[1],
                      .anchor_w = v[2],
                      .k = v[3],
                      .f = v[4],
                      .h = v[1],
                      .w = v[2]};
}

absl::StatusOr<std::array<int64_t, 4>> ParseRopeShifts(absl::string_view text,
                                                       absl::string_view field) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  if (parts.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected 4 integers"));
  }
  std::array<int64_t, 4> shifts{};
  for (int i = 0; i < 4; ++i) {
    if (!absl::SimpleAtoi(parts[i], &shifts[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", parts[i], "' is not an integer"));
    }
  }
  return shifts;
}

}  // namespace praxis::wire
