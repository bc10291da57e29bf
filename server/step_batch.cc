#include "server/step_batch.h"

#include <vector>

namespace praxis::serve {

model::StepInputs StackSteps(absl::Span<const model::StepInputs* const> steps) {
  model::StepInputs out = *steps.front();
  if (steps.size() == 1) return out;
  std::vector<torch::Tensor> parts(steps.size());
  for (const wire::InputField& field : wire::kInputFields) {
    if (!(out.*field.tensor).defined()) continue;  // clean, for K == 1: undefined in every step
    for (size_t i = 0; i < steps.size(); ++i) parts[i] = steps[i]->*field.tensor;
    out.*field.tensor = torch::cat(parts, 0);
  }
  return out;
}

model::BackboneOutput SliceRows(const model::BackboneOutput& out, int64_t start, int64_t rows) {
  auto slice = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, start, rows) : t; };
  model::BackboneOutput s = out;
  s.velocity = slice(out.velocity);
  s.cond = slice(out.cond);
  for (torch::Tensor& t : s.features.taps) t = slice(t);
  s.features.embeddings = slice(out.features.embeddings);
  s.features.positions = slice(out.features.positions);
  return s;
}

model::BackboneOutput TaskRows(const model::BackboneOutput& out, int64_t start, int64_t rows,
                               const model::OutputSelection& task,
                               const model::OutputSelection& every) {
  model::BackboneOutput s = SliceRows(out, start, rows);
  const auto mine = model::OutputSlots(s, task);
  const auto shared = model::OutputSlots(s, every);
  for (size_t i = 0; i < mine.size(); ++i) {
    torch::Tensor& t = *mine[i].first;
    if (!mine[i].second) {
      t = torch::Tensor();
    } else if (!shared[i].second && t.defined()) {
      t = t.clone(torch::MemoryFormat::Contiguous);
    }
  }
  return s;
}

}  // namespace praxis::serve
