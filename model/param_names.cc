#include "model/param_names.h"

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "model/checkpoint.h"

namespace praxis::model {
namespace {

using Shape = std::vector<int64_t>;
using C = const BackboneConfig&;
using T = const TowerConfig&;
using S = ParamScope;
using P = ParamId;

// The reference module's state_dict order: a tower's own parameters (shared, then the decoder's or
// the encoder's), then each block's. Within a module, weight precedes bias; an MoE's own buffer
// (expert_bias) precedes its children.
// One row per entry, so that it reads as the table it is.
// clang-format off
const ParamRow kTable[] = {
    {P::kRegisters, "registers", S::kTower, false,
     [](C c, T) -> Shape { return {c.num_registers, c.dim}; }},
    {P::kTimeFreqs, "t_embedding.freqs", S::kTower, true,
     [](C c, T) -> Shape { return {c.timestep_dim}; }},
    {P::kTimePhases, "t_embedding.phases", S::kTower, true,
     [](C c, T) -> Shape { return {c.timestep_dim}; }},
    {P::kTimeProjWeight, "t_proj.VideoTensor.weight", S::kTower, false,
     [](C c, T) -> Shape { return {2 * c.dim, c.timestep_dim}; }},
    {P::kTimeProjBias, "t_proj.VideoTensor.bias", S::kTower, false,
     [](C c, T) -> Shape { return {2 * c.dim}; }},
    {P::kVideoInWeight, "input_projections.VideoTensor.proj.weight", S::kTower, false,
     [](C c, T t) -> Shape { return {c.dim, t.video_in_c_in}; }},
    {P::kVideoInBias, "input_projections.VideoTensor.proj.bias", S::kTower, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kDecoderOutNorm, "output_projections.VideoTensor.proj.0.weight", S::kDecoder, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kDecoderOutWeight, "output_projections.VideoTensor.proj.1.weight", S::kDecoder, false,
     [](C c, T t) -> Shape { return {t.video_out_c_out, c.dim}; }},
    {P::kDecoderOutBias, "output_projections.VideoTensor.proj.1.bias", S::kDecoder, false,
     [](C, T t) -> Shape { return {t.video_out_c_out}; }},
    {P::kTextFc1Weight, "input_projections.TextEncodingTensor.proj.0.weight", S::kEncoder, false,
     [](C c, T t) -> Shape { return {4 * c.dim, t.text_in_c_in}; }},
    {P::kTextFc1Bias, "input_projections.TextEncodingTensor.proj.0.bias", S::kEncoder, false,
     [](C c, T) -> Shape { return {4 * c.dim}; }},
    {P::kTextFc2Weight, "input_projections.TextEncodingTensor.proj.2.weight", S::kEncoder, false,
     [](C c, T) -> Shape { return {c.dim, 4 * c.dim}; }},
    {P::kTextFc2Bias, "input_projections.TextEncodingTensor.proj.2.bias", S::kEncoder, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kTextNorm, "input_projections.TextEncodingTensor.proj.3.weight", S::kEncoder, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kEncoderOutWeight, "output_projections.VideoTensor.proj.weight", S::kEncoder, false,
     [](C c, T) -> Shape { return {c.dim, c.dim}; }},
    {P::kEncoderOutBias, "output_projections.VideoTensor.proj.bias", S::kEncoder, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kNorm1, "norm1.weight", S::kBlock, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kQWeight, "mha.in_proj.q_weight", S::kBlock, false,
     [](C c, T) -> Shape { return {c.num_heads * c.head_dim(), c.dim}; }},
    {P::kKWeight, "mha.in_proj.k_weight", S::kBlock, false,
     [](C c, T) -> Shape { return {c.num_kv_heads * c.head_dim(), c.dim}; }},
    {P::kVWeight, "mha.in_proj.v_weight", S::kBlock, false,
     [](C c, T) -> Shape { return {c.num_kv_heads * c.head_dim(), c.dim}; }},
    {P::kQNorm, "mha.q_norm.weight", S::kQkNormBlock, false,
     [](C c, T) -> Shape { return {c.head_dim()}; }},
    {P::kKNorm, "mha.k_norm.weight", S::kQkNormBlock, false,
     [](C c, T) -> Shape { return {c.head_dim()}; }},
    {P::kGateWeight, "mha.gate.weight", S::kBlock, false,
     [](C c, T) -> Shape { return {c.num_heads, c.dim}; }},
    {P::kGateBias, "mha.gate.bias", S::kBlock, false,
     [](C c, T) -> Shape { return {c.num_heads}; }},
    {P::kOutProjWeight, "mha.out_proj.weight", S::kBlock, false,
     [](C c, T) -> Shape { return {c.dim, c.dim}; }},
    {P::kOutProjBias, "mha.out_proj.bias", S::kBlock, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kNorm2, "norm2.weight", S::kBlock, false,
     [](C c, T) -> Shape { return {c.dim}; }},
    {P::kFfnAWeight, "ffn.0.linear.a_weight", S::kDenseBlock, false,
     [](C c, T t) -> Shape { return {t.ffn_dim, c.dim}; }},
    {P::kFfnBWeight, "ffn.0.linear.b_weight", S::kDenseBlock, false,
     [](C c, T t) -> Shape { return {t.ffn_dim, c.dim}; }},
    {P::kFfnDownWeight, "ffn.1.weight", S::kDenseBlock, false,
     [](C c, T t) -> Shape { return {c.dim, t.ffn_dim}; }},
    {P::kExpertBias, "ffn.expert_bias", S::kMoeBlock, true,
     [](C c, T) -> Shape { return {c.moe.num_experts}; }},
    {P::kRouterWeight, "ffn.router.weight", S::kMoeBlock, false,
     [](C c, T) -> Shape { return {c.moe.num_experts, c.dim}; }},
    {P::kRoutedGateUp, "ffn.routed.gate_up_weight", S::kMoeBlock, false,
     [](C c, T) -> Shape { return {c.moe.num_experts, c.dim, 2 * c.moe.expert_dim}; }},
    {P::kRoutedDown, "ffn.routed.down_weight", S::kMoeBlock, false,
     [](C c, T) -> Shape { return {c.moe.num_experts, c.moe.expert_dim, c.dim}; }},
    {P::kSharedGateUp, "ffn.shared.gate_up", S::kMoeBlock, false,
     [](C c, T) -> Shape { return {c.dim, 2 * c.moe.shared_dim}; }},
    {P::kSharedDown, "ffn.shared.down", S::kMoeBlock, false,
     [](C c, T) -> Shape { return {c.moe.shared_dim, c.dim}; }},
    {P::kModulationWeight, "modulation.weight", S::kDecoderBlock, false,
     [](C c, T) -> Shape { return {2 * c.dim, c.dim}; }},
    {P::kModulationBias, "modulation.bias", S::kDecoderBlock, false,
     [](C c, T) -> Shape { return {2 * c.dim}; }},
};
// clang-format on

bool IsBlockRow(const ParamRow& row) {
  return row.scope != S::kTower && row.scope != S::kEncoder && row.scope != S::kDecoder;
}

// Whether `row` is a parameter of `tower` (for block rows: of its block `block`).
bool Present(const ParamRow& row, const BackboneConfig& c, TowerKind tower, int64_t block) {
  const bool decoder = tower == TowerKind::kDecoder;
  const TowerConfig& t = decoder ? c.decoder : c.encoder;
  switch (row.scope) {
    case S::kTower:
    case S::kBlock:
      return true;
    case S::kEncoder:
      return !decoder;
    case S::kDecoder:
    case S::kDecoderBlock:
      return decoder;
    case S::kQkNormBlock:
      return c.qk_norm;
    case S::kDenseBlock:
      return !t.is_moe(block);
    case S::kMoeBlock:
      return t.is_moe(block);
  }
  return false;
}

const ParamRow& Row(ParamId id) {
  for (const ParamRow& row : kTable) {
    if (row.id == id) return row;
  }
  PRAXIS_CHECK(false, "a ParamId without a row in kTable");
  std::abort();
}

std::string BlockPrefix(int64_t block) { return absl::StrCat("blocks.", block, "."); }

}  // namespace

absl::Span<const ParamRow> ParamTable() { return kTable; }

std::vector<NamedParam> ListParameters(const BackboneConfig& config) {
  std::vector<NamedParam> out;
  for (TowerKind tower : {TowerKind::kEncoder, TowerKind::kDecoder}) {
    const TowerConfig& t = tower == TowerKind::kDecoder ? config.decoder : config.encoder;
    const std::string prefix = TowerPrefix(tower);
    for (const ParamRow& row : kTable) {
      if (IsBlockRow(row) || !Present(row, config, tower, 0)) continue;
      out.push_back({prefix + row.name, row.shape(config, t), row.float32});
    }
    for (int64_t i = 0; i < t.depth; ++i) {
      for (const ParamRow& row : kTable) {
        if (!IsBlockRow(row) || !Present(row, config, tower, i)) continue;
        out.push_back({prefix + BlockPrefix(i) + row.name, row.shape(config, t), row.float32});
      }
    }
  }
  return out;
}

std::string TowerPrefix(TowerKind tower) {
  return absl::StrCat(kBackbonePrefix, tower == TowerKind::kDecoder ? "decoder." : "encoder.");
}

std::string ParamName(TowerKind tower, ParamId id) {
  const ParamRow& row = Row(id);
  PRAXIS_CHECK(!IsBlockRow(row), row.name);
  return TowerPrefix(tower) + row.name;
}

std::string BlockParamName(TowerKind tower, int64_t block, ParamId id) {
  const ParamRow& row = Row(id);
  PRAXIS_CHECK(IsBlockRow(row), row.name);
  return TowerPrefix(tower) + BlockPrefix(block) + row.name;
}

std::string ParamPattern(const ParamRow& row) {
  return IsBlockRow(row) ? absl::StrCat("blocks.{i}.", row.name) : row.name;
}

}  // namespace praxis::model
