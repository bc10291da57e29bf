#include "client/load_mix.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "wire/layout_key.h"
#include "wire/output_names.h"
#include "wire/synthetic.h"

namespace praxis::client {

absl::StatusOr<std::vector<MixEntry>> ParseMix(const std::string& text, const wire::StepDims& dims,
                                               int64_t rows, const RequestOptions& options) {
  std::vector<MixEntry> mix;
  for (absl::string_view item : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    MixEntry e;
    std::vector<std::string> weighted = absl::StrSplit(item, '*');
    if (weighted.size() > 2 ||
        (weighted.size() == 2 && (!absl::SimpleAtod(weighted[1], &e.weight) || e.weight <= 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mix: expected ENTRY*WEIGHT with a positive weight, got \"", item, "\""));
    }
    std::string layout = weighted[0];
    bool decode = true;
    if (absl::EndsWith(layout, ",enc")) {
      decode = false;
      layout.resize(layout.size() - 4);
    }
    PRAXIS_ASSIGN_OR_RETURN(const wire::StepGeometry l, wire::ParseLayout(layout, "--mix"));
    wire::StepInputs in = wire::SyntheticInputs(dims, l, rows, mix.size());
    in.decode = decode;
    RequestOptions o = options;
    if (!decode) std::erase(o.outputs, std::string(wire::kVelocity));
    if (o.outputs.empty()) o.outputs = {wire::kCond};
    e.name = absl::StrCat(layout, decode ? "" : ",enc");
    o.request_id = e.name;
    PRAXIS_ASSIGN_OR_RETURN(e.request, MakeStepRequest(in, o));
    mix.push_back(std::move(e));
  }
  if (mix.empty()) return absl::InvalidArgumentError("--mix: expected at least one entry");
  return mix;
}

}  // namespace praxis::client
