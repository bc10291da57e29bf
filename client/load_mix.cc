#include "client/load_mix.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "model/step_batch.h"
#include "model/step_io.h"

namespace praxis::client {

absl::StatusOr<std::vector<MixEntry>> ParseMix(const std::string& text,
                                               const model::BackboneConfig& config, int64_t rows,
                                               const RequestOptions& options) {
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
    PRAXIS_ASSIGN_OR_RETURN(const model::WindowLayout l, model::ParseLayout(layout, "--mix"));
    model::StepInputs in = model::SyntheticStep(config, l, rows, mix.size());
    in.decode = decode;
    RequestOptions o = options;
    if (!decode) std::erase(o.outputs, std::string("velocity"));
    if (o.outputs.empty()) o.outputs = {"cond"};
    e.name = absl::StrCat(layout, decode ? "" : ",enc");
    o.request_id = e.name;
    PRAXIS_ASSIGN_OR_RETURN(e.request, MakeStepRequest(in, o));
    mix.push_back(std::move(e));
  }
  if (mix.empty()) return absl::InvalidArgumentError("--mix: expected at least one entry");
  return mix;
}

}  // namespace praxis::client
