#include "model/config_bounds.h"

#include <initializer_list>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace praxis::model {
namespace {

// A sum of products of sizes, with checked arithmetic: an overflow is remembered, not wrapped.
class ParamSum {
 public:
  ParamSum& Add(std::initializer_list<int64_t> dims) {
    Accumulate(CheckedProduct(dims));
    return *this;
  }
  // nn.Linear(in, out): weight [out, in] (out given as factors, e.g. {2, dim}), bias [out].
  ParamSum& Linear(int64_t in, std::initializer_list<int64_t> out) {
    const std::optional<int64_t> n = CheckedProduct(out);
    Accumulate(n ? CheckedMul(*n, in) : std::nullopt);
    Accumulate(n);
    return *this;
  }
  // `times` copies of `other`'s sum.
  ParamSum& AddTimes(int64_t times, const ParamSum& other) {
    Accumulate(other.total_ ? CheckedMul(times, *other.total_) : std::nullopt);
    return *this;
  }
  std::optional<int64_t> total() const { return total_; }

 private:
  void Accumulate(std::optional<int64_t> n) {
    total_ = total_ && n ? CheckedAdd(*total_, *n) : std::nullopt;
  }
  std::optional<int64_t> total_ = 0;
};

// One block's norms, attention and (decoder) modulation, without its FFN: the tensors of
// ExpectedParameters' SpecWriter::Block, counted.
ParamSum BlockParams(const BackboneConfig& c, bool decoder) {
  const int64_t d = c.dim, hd = c.head_dim();
  ParamSum s;
  s.Add({d}).Add({c.num_heads, hd, d}).Add({2, c.num_kv_heads, hd, d});
  if (c.qk_norm) s.Add({2, hd});
  s.Linear(d, {c.num_heads}).Linear(d, {d}).Add({d});
  if (decoder) s.Linear(d, {2, d});
  return s;
}

// One tower: registers, time embedding, projections, then its dense and MoE blocks.
ParamSum TowerParams(const BackboneConfig& c, const TowerConfig& t, bool decoder) {
  const int64_t d = c.dim, moe_blocks = static_cast<int64_t>(t.moe_blocks.size());
  const MoeConfig& m = c.moe;
  ParamSum s;
  s.Add({c.num_registers, d}).Add({2, c.timestep_dim}).Linear(c.timestep_dim, {2, d});
  s.Linear(t.video_in_c_in, {d});
  if (decoder) {
    s.Add({d}).Linear(d, {t.video_out_c_out});
  } else {
    s.Linear(t.text_in_c_in, {4, d}).Add({4, d, d}).Add({d}).Add({d}).Linear(d, {d});
  }
  ParamSum dense_ffn, moe_ffn;
  dense_ffn.Add({3, t.ffn_dim, d});
  moe_ffn.Add({m.num_experts}).Add({m.num_experts, d}).Add({3, m.num_experts, d, m.expert_dim});
  moe_ffn.Add({3, d, m.shared_dim});
  s.AddTimes(t.depth, BlockParams(c, decoder));
  s.AddTimes(t.depth - moe_blocks, dense_ffn).AddTimes(moe_blocks, moe_ffn);
  return s;
}

// At most `limit`; InvalidArgument "backbone.`key`: `v` exceeds the limit of `limit`".
absl::Status AtMost(absl::string_view key, int64_t v, int64_t limit) {
  if (v <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("backbone.", key, ": ", v, " exceeds the limit of ", limit));
}

}  // namespace

absl::StatusOr<int64_t> ParameterCount(const BackboneConfig& config) {
  ParamSum s;
  s.AddTimes(1, TowerParams(config, config.encoder, /*decoder=*/false));
  s.AddTimes(1, TowerParams(config, config.decoder, /*decoder=*/true));
  if (!s.total()) {
    return absl::InvalidArgumentError(
        "backbone: the parameter count overflows int64 (dim, depth, ffn_dim and moe sizes)");
  }
  return *s.total();
}

absl::Status ValidateConfigBounds(const BackboneConfig& c) {
  for (const auto& [key, v] : {std::pair{"dim", c.dim},
                               {"timestep_dim", c.timestep_dim},
                               {"text_dim", c.text_dim},
                               {"moe.expert_dim", c.moe.expert_dim},
                               {"moe.shared_dim", c.moe.shared_dim},
                               {"encoder.ffn_dim", c.encoder.ffn_dim},
                               {"decoder.ffn_dim", c.decoder.ffn_dim},
                               {"encoder.video_in.c_in", c.encoder.video_in_c_in}}) {
    PRAXIS_RETURN_IF_ERROR(AtMost(key, v, kMaxWidth));
  }
  PRAXIS_RETURN_IF_ERROR(AtMost("encoder.depth", c.encoder.depth, kMaxDepth));
  PRAXIS_RETURN_IF_ERROR(AtMost("decoder.depth", c.decoder.depth, kMaxDepth));
  PRAXIS_RETURN_IF_ERROR(AtMost("moe.num_experts", c.moe.num_experts, kMaxExperts));
  PRAXIS_RETURN_IF_ERROR(AtMost("num_registers", c.num_registers, kMaxRegisters));
  PRAXIS_RETURN_IF_ERROR(AtMost("attention.flex_block_size", c.flex_block_size, kMaxBlockSize));
  for (const auto& [key, v] : {std::pair{"text_position_offset", c.text_position_offset},
                               {"decoder_frame_block_offset", c.decoder_frame_block_offset}}) {
    if (v < -kMaxPositionOffset || v > kMaxPositionOffset) {
      return absl::InvalidArgumentError(
          absl::StrCat("backbone.", key, ": ", v, " is beyond +-", kMaxPositionOffset));
    }
  }
  PRAXIS_ASSIGN_OR_RETURN(const int64_t n, ParameterCount(c));
  if (n > kMaxParameters) {
    return absl::InvalidArgumentError(
        absl::StrCat("backbone: ", n, " parameters exceed the limit of ", kMaxParameters,
                     " (dim, depth, ffn_dim and moe sizes)"));
  }
  return absl::OkStatus();
}

}  // namespace praxis::model
