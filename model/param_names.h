#pragma once

// The one table of checkpoint parameters: the name, shape and dtype class of every tensor of a
// config (docs/model.md, "Checkpoint parameter names"; tests/model/param_names_test.cc checks the
// doc against this table). The loader's expected list (ExpectedParameters) and the weight binding
// (model/weight_binding.cc) both read it, so a name is written once, here, in param_names.cc.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "model/config.h"

namespace praxis::model {

enum class TowerKind { kEncoder, kDecoder };

// One row of the table. Tower rows come first, then block rows (names after "blocks.{i}.").
enum class ParamId {
  // Tower rows, both towers.
  kRegisters,
  kTimeFreqs,
  kTimePhases,
  kTimeProjWeight,
  kTimeProjBias,
  kVideoInWeight,
  kVideoInBias,
  // Tower rows, decoder only: video_out's norm and linear.
  kDecoderOutNorm,
  kDecoderOutWeight,
  kDecoderOutBias,
  // Tower rows, encoder only: text_in (fc1, fc2, norm) and video_out.
  kTextFc1Weight,
  kTextFc1Bias,
  kTextFc2Weight,
  kTextFc2Bias,
  kTextNorm,
  kEncoderOutWeight,
  kEncoderOutBias,
  // Block rows: attention (qk norms only with qk_norm).
  kNorm1,
  kQWeight,
  kKWeight,
  kVWeight,
  kQNorm,
  kKNorm,
  kGateWeight,
  kGateBias,
  kOutProjWeight,
  kOutProjBias,
  kNorm2,
  // Block rows: dense FFN or MoE, as TowerConfig::is_moe says.
  kFfnAWeight,
  kFfnBWeight,
  kFfnDownWeight,
  kExpertBias,
  kRouterWeight,
  kRoutedGateUp,
  kRoutedDown,
  kSharedGateUp,
  kSharedDown,
  // Block rows, decoder only.
  kModulationWeight,
  kModulationBias,
};

// Where a row of the table is present.
enum class ParamScope {
  kTower,         // once in each tower
  kEncoder,       // once, in the encoder
  kDecoder,       // once, in the decoder
  kBlock,         // in every block
  kQkNormBlock,   // in every block, with qk_norm
  kDenseBlock,    // in every dense-FFN block
  kMoeBlock,      // in every MoE block
  kDecoderBlock,  // in every decoder block
};

// A row: `name` is after the tower prefix ("backbone.encoder."), and for block rows after
// "blocks.{i}." too. `float32` rows are float32 whatever the checkpoint's dtype.
struct ParamRow {
  ParamId id;
  const char* name;
  ParamScope scope;
  bool float32;
  std::vector<int64_t> (*shape)(const BackboneConfig& config, const TowerConfig& tower);
};

// Every row, in the reference module's state_dict order within a tower and within a block.
absl::Span<const ParamRow> ParamTable();

// One parameter of a config, with its full checkpoint name.
struct NamedParam {
  std::string name;
  std::vector<int64_t> shape;
  bool float32 = false;
};

// Every parameter of `config` in state_dict order: the encoder then the decoder, each tower's own
// rows then block by block. `config` must be valid (ParseConfig).
std::vector<NamedParam> ListParameters(const BackboneConfig& config);

// "backbone.encoder." or "backbone.decoder.".
std::string TowerPrefix(TowerKind tower);

// The full name of tower row `id` of `tower`; `id` must be a tower row (crashes otherwise).
std::string ParamName(TowerKind tower, ParamId id);

// The full name of block row `id` of block `block` of `tower`; `id` must be a block row.
std::string BlockParamName(TowerKind tower, int64_t block, ParamId id);

// A row's name as docs/model.md writes it: tower rows as is, block rows as "blocks.{i}.NAME".
std::string ParamPattern(const ParamRow& row);

}  // namespace praxis::model
