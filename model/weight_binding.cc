#include "model/weight_binding.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "model/layers.h"
#include "model/param_names.h"

namespace praxis::model {
namespace {

using P = ParamId;

// Looks one tower's weights up by table row, remembering the first missing one and counting the
// names found (so that a row the binding forgets to read is caught).
class WeightReader {
 public:
  WeightReader(const TensorMap& map, torch::Device device) : map_(map), device_(device) {}

  void set_tower(TowerKind tower) { tower_ = tower; }
  // Tower row `id` of the current tower.
  torch::Tensor operator()(ParamId id) { return Read(ParamName(tower_, id)); }
  // Block row `id` of block `block` of the current tower.
  torch::Tensor operator()(int64_t block, ParamId id) {
    return Read(BlockParamName(tower_, block, id));
  }

  int64_t found() const { return found_; }
  absl::Status status() const {
    return missing_.empty()
               ? absl::OkStatus()
               : absl::InvalidArgumentError(absl::StrCat("missing weight '", missing_, "'"));
  }

 private:
  torch::Tensor Read(const std::string& name) {
    auto it = map_.find(name);
    if (it == map_.end()) {
      if (missing_.empty()) missing_ = name;
      return {};
    }
    ++found_;
    return it->second.to(device_);
  }

  const TensorMap& map_;
  const torch::Device device_;
  TowerKind tower_ = TowerKind::kEncoder;
  std::string missing_;
  int64_t found_ = 0;
};

// NormWeight of a weight that may be missing (the reader reports it).
torch::Tensor NormWeightOf(const torch::Tensor& weight, double scale) {
  return weight.defined() ? NormWeight(weight, scale) : weight;
}

// The attention weights of block `i`: prepared norms, and q, k, v and the gate read as one matmul
// over their stacked rows.
void ReadAttention(WeightReader& get, const BackboneConfig& c, int64_t i, BlockWeights& bw) {
  bw.norm1 = NormWeightOf(get(i, P::kNorm1), bw.scale);
  bw.norm2 = NormWeightOf(get(i, P::kNorm2), bw.scale);
  if (c.qk_norm) {
    bw.q_norm = NormWeightOf(get(i, P::kQNorm), 1.0);
    bw.k_norm = NormWeightOf(get(i, P::kKNorm), 1.0);
  }
  const torch::Tensor q = get(i, P::kQWeight), k = get(i, P::kKWeight), v = get(i, P::kVWeight),
                      gate_w = get(i, P::kGateWeight), gate_b = get(i, P::kGateBias);
  if (q.defined() && k.defined() && v.defined() && gate_w.defined() && gate_b.defined()) {
    bw.qkvg_w = torch::cat({q, k, v, gate_w}, 0);
    bw.qkvg_b =
        torch::cat({torch::zeros({q.size(0) + k.size(0) + v.size(0)}, gate_b.options()), gate_b});
    bw.gate_b = gate_b.to(torch::kFloat32).contiguous();
  }
  bw.out_w = get(i, P::kOutProjWeight);
  bw.out_b = get(i, P::kOutProjBias);
}

BlockWeights ReadBlock(WeightReader& get, const BackboneConfig& c, const TowerConfig& t, int64_t i,
                       bool decoder) {
  BlockWeights bw;
  bw.scale = 1.0 / std::sqrt(static_cast<double>(i + 1));
  ReadAttention(get, c, i, bw);
  bw.moe = t.is_moe(i);
  if (bw.moe) {
    bw.moe_w = {get(i, P::kRouterWeight), get(i, P::kExpertBias),   get(i, P::kRoutedGateUp),
                get(i, P::kRoutedDown),   get(i, P::kSharedGateUp), get(i, P::kSharedDown)};
  } else {
    bw.ffn_a = get(i, P::kFfnAWeight);
    bw.ffn_b = get(i, P::kFfnBWeight);
    bw.ffn_down = get(i, P::kFfnDownWeight);
  }
  if (decoder) {
    bw.mod_w = get(i, P::kModulationWeight);
    bw.mod_b = get(i, P::kModulationBias);
  }
  return bw;
}

TowerWeights ReadTower(WeightReader& get, const BackboneConfig& c, TowerKind tower) {
  const bool decoder = tower == TowerKind::kDecoder;
  const TowerConfig& t = decoder ? c.decoder : c.encoder;
  get.set_tower(tower);
  TowerWeights w{
      get(P::kRegisters),    get(P::kTimeFreqs),     get(P::kTimePhases),  get(P::kTimeProjWeight),
      get(P::kTimeProjBias), get(P::kVideoInWeight), get(P::kVideoInBias), {}};
  for (int64_t i = 0; i < t.depth; ++i) w.blocks.push_back(ReadBlock(get, c, t, i, decoder));
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BackboneWeights>> BindWeights(const BackboneConfig& config,
                                                             const TensorMap& weights,
                                                             torch::Device device) {
  WeightReader get(weights, device);
  auto w = std::make_unique<BackboneWeights>();
  w->enc.tower = ReadTower(get, config, TowerKind::kEncoder);
  w->dec.tower = ReadTower(get, config, TowerKind::kDecoder);
  get.set_tower(TowerKind::kEncoder);
  w->enc.text_fc1_w = get(P::kTextFc1Weight);
  w->enc.text_fc1_b = get(P::kTextFc1Bias);
  w->enc.text_fc2_w = get(P::kTextFc2Weight);
  w->enc.text_fc2_b = get(P::kTextFc2Bias);
  w->enc.text_norm = get(P::kTextNorm);
  w->enc.enc_out_w = get(P::kEncoderOutWeight);
  w->enc.enc_out_b = get(P::kEncoderOutBias);
  get.set_tower(TowerKind::kDecoder);
  w->dec.norm = get(P::kDecoderOutNorm);
  w->dec.out_w = get(P::kDecoderOutWeight);
  w->dec.out_b = get(P::kDecoderOutBias);
  PRAXIS_RETURN_IF_ERROR(get.status());
  // Every name read is a distinct row of the table; reading them all is this function's contract.
  PRAXIS_CHECK(get.found() == static_cast<int64_t>(ListParameters(config).size()),
               "BindWeights does not read every row of the parameter table");
  return w;
}

}  // namespace praxis::model
