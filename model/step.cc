#include "model/step.h"

#include "wire/output_names.h"

namespace praxis::model {

std::vector<std::pair<std::string, torch::Tensor>> NamedOutputs(const BackboneOutput& out) {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  if (out.velocity.defined()) named.emplace_back(wire::kVelocity, out.velocity);
  named.emplace_back(wire::kCond, out.cond);
  for (size_t i = 0; i < out.features.taps.size(); ++i) {
    named.emplace_back(wire::TapName(static_cast<int>(i)), out.features.taps[i]);
  }
  named.emplace_back(wire::kEmbeddings, out.features.embeddings);
  named.emplace_back(wire::kPositions, out.features.positions);
  return named;
}

}  // namespace praxis::model
