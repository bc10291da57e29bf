#include "model/step.h"

#include <algorithm>
#include <iterator>

#include "wire/output_names.h"

namespace praxis::model {

OutputSelection OutputSelection::All(int n_taps) {
  OutputSelection s{true, true, {}, true, true};
  for (int i = 0; i < n_taps; ++i) s.taps.push_back(i);
  return s;
}

namespace {

std::vector<int> Sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

OutputSelection WantedByAny(const std::vector<const OutputSelection*>& selections) {
  OutputSelection any;
  for (const OutputSelection* s : selections) {
    any.velocity |= s->velocity;
    any.cond |= s->cond;
    any.embeddings |= s->embeddings;
    any.positions |= s->positions;
    std::vector<int> taps;
    const std::vector<int> mine = Sorted(s->taps);
    std::set_union(any.taps.begin(), any.taps.end(), mine.begin(), mine.end(),
                   std::back_inserter(taps));
    any.taps = std::move(taps);
  }
  return any;
}

OutputSelection WantedByAll(const std::vector<const OutputSelection*>& selections) {
  if (selections.empty()) return {};
  OutputSelection all = *selections.front();
  all.taps = Sorted(all.taps);
  for (const OutputSelection* s : selections) {
    all.velocity &= s->velocity;
    all.cond &= s->cond;
    all.embeddings &= s->embeddings;
    all.positions &= s->positions;
    std::vector<int> taps;
    const std::vector<int> mine = Sorted(s->taps);
    std::set_intersection(all.taps.begin(), all.taps.end(), mine.begin(), mine.end(),
                          std::back_inserter(taps));
    all.taps = std::move(taps);
  }
  return all;
}

std::vector<std::pair<torch::Tensor*, bool>> OutputSlots(BackboneOutput& out,
                                                         const OutputSelection& wanted) {
  std::vector<std::pair<torch::Tensor*, bool>> slots;
  slots.emplace_back(&out.velocity, wanted.velocity);
  slots.emplace_back(&out.cond, wanted.cond);
  std::vector<torch::Tensor>& taps = out.features.taps;
  for (size_t i = 0; i < taps.size(); ++i) {
    const bool want =
        std::find(wanted.taps.begin(), wanted.taps.end(), static_cast<int>(i)) != wanted.taps.end();
    slots.emplace_back(&taps[i], want);
  }
  slots.emplace_back(&out.features.embeddings, wanted.embeddings);
  slots.emplace_back(&out.features.positions, wanted.positions);
  return slots;
}

void KeepOnly(BackboneOutput& out, const OutputSelection& wanted) {
  for (auto& [tensor, want] : OutputSlots(out, wanted)) {
    if (!want) *tensor = torch::Tensor();
  }
}

std::vector<std::pair<std::string, torch::Tensor>> NamedOutputs(const BackboneOutput& out) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  auto add = [&named](std::string name, const torch::Tensor& t) {
    if (t.defined()) named.emplace_back(std::move(name), t);
  };
  add(wire::kVelocity, out.velocity);
  add(wire::kCond, out.cond);
  for (size_t i = 0; i < out.features.taps.size(); ++i) {
    add(wire::TapName(static_cast<int>(i)), out.features.taps[i]);
  }
  add(wire::kEmbeddings, out.features.embeddings);
  add(wire::kPositions, out.features.positions);
  return named;
}

}  // namespace praxis::model
