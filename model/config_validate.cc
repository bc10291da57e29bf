#include "model/config_validate.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "model/config_bounds.h"

namespace praxis::model {
namespace {

constexpr char kDtypes[] = "('float32', 'bfloat16', 'float16')";
constexpr char kGelus[] = "('tanh', 'none')";

absl::Status Need(bool ok, absl::string_view what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat("backbone: ", what));
}

bool InRange(const std::vector<int64_t>& v, int64_t n) {
  return std::all_of(v.begin(), v.end(), [n](int64_t i) { return i >= 0 && i < n; });
}

bool IsDtype(const std::string& name) { return ParseDtype(name).ok(); }

// Widths, heads, dtypes and the MoE; the same checks, in the same order, as `_validate`.
absl::Status ValidateTrunk(const BackboneConfig& c) {
  for (const auto& [name, v] : {std::pair{"dim", c.dim},
                                {"num_heads", c.num_heads},
                                {"num_kv_heads", c.num_kv_heads},
                                {"timestep_dim", c.timestep_dim},
                                {"text_dim", c.text_dim}}) {
    PRAXIS_RETURN_IF_ERROR(Need(v > 0, absl::StrCat(name, " must be positive")));
  }
  PRAXIS_RETURN_IF_ERROR(Need(c.num_registers >= 0, "num_registers must be >= 0"));
  PRAXIS_RETURN_IF_ERROR(Need(c.dim % c.num_heads == 0, "dim must be divisible by num_heads"));
  PRAXIS_RETURN_IF_ERROR(Need(c.head_dim() % 2 == 0, "head_dim = dim / num_heads must be even"));
  PRAXIS_RETURN_IF_ERROR(
      Need(c.num_heads % c.num_kv_heads == 0, "num_heads must be divisible by num_kv_heads"));
  PRAXIS_RETURN_IF_ERROR(Need(IsDtype(c.dtype), absl::StrCat("dtype must be one of ", kDtypes)));
  PRAXIS_RETURN_IF_ERROR(
      Need(IsDtype(c.modulation_dtype), absl::StrCat("modulation_dtype must be one of ", kDtypes)));
  PRAXIS_RETURN_IF_ERROR(Need(c.gelu_approximate == "tanh" || c.gelu_approximate == "none",
                              absl::StrCat("gelu_approximate must be one of ", kGelus)));
  PRAXIS_RETURN_IF_ERROR(
      Need(c.norm_eps > 0 && c.rope_theta > 0, "norm_eps and rope_theta must be positive"));
  PRAXIS_RETURN_IF_ERROR(Need(c.flex_block_size > 0, "attention.flex_block_size must be positive"));
  const MoeConfig& m = c.moe;
  PRAXIS_RETURN_IF_ERROR(Need(m.num_experts > 0 && m.top_k > 0 && m.top_k <= m.num_experts,
                              "moe: need 0 < top_k <= num_experts"));
  return Need(m.expert_dim > 0 && m.shared_dim > 0,
              "moe: expert_dim and shared_dim must be positive");
}

absl::Status ValidateTower(absl::string_view name, const TowerConfig& t) {
  PRAXIS_RETURN_IF_ERROR(Need(t.depth > 0 && t.ffn_dim > 0,
                              absl::StrCat(name, ": depth and ffn_dim must be positive")));
  PRAXIS_RETURN_IF_ERROR(
      Need(InRange(t.moe_blocks, t.depth), absl::StrCat(name, ".moe_blocks out of range")));
  const std::set<int64_t> distinct(t.moe_blocks.begin(), t.moe_blocks.end());
  PRAXIS_RETURN_IF_ERROR(Need(distinct.size() == t.moe_blocks.size(),
                              absl::StrCat(name, ".moe_blocks has duplicates")));
  return Need(t.video_in_c_in > 0, absl::StrCat(name, ".video_in.c_in must be positive"));
}

// How the towers fit together: taps, text width, and the decoder's unpatch of the latents.
absl::Status ValidateTowers(const BackboneConfig& c) {
  PRAXIS_RETURN_IF_ERROR(ValidateTower("encoder", c.encoder));
  PRAXIS_RETURN_IF_ERROR(ValidateTower("decoder", c.decoder));
  const TowerConfig& e = c.encoder;
  const TowerConfig& d = c.decoder;
  PRAXIS_RETURN_IF_ERROR(Need(InRange(e.tap_blocks, e.depth), "encoder.tap_blocks out of range"));
  PRAXIS_RETURN_IF_ERROR(
      Need(e.text_in_c_in == c.text_dim, "encoder.text_in.c_in must equal text_dim"));
  PRAXIS_RETURN_IF_ERROR(
      Need(d.unpatch_factor.size() == 3, "decoder.unpatch_factor must have 3 entries"));
  PRAXIS_RETURN_IF_ERROR(
      Need(d.unpatch_factor[0] == 1, "decoder.unpatch_factor[0] (time) must be 1"));
  constexpr char kDivisible[] =
      "encoder.video_in.c_in must be divisible by unpatch_factor[1] * unpatch_factor[2]";
  PRAXIS_RETURN_IF_ERROR(Need(c.ph() > 0 && c.pw() > 0, kDivisible));
  // Checked: [1, 2^32, 2^32] wraps to 0, and c_in % 0 is a SIGFPE.
  PRAXIS_ASSIGN_OR_RETURN(
      const int64_t patch,
      CheckedProductOr(d.unpatch_factor, "backbone.decoder.unpatch_factor", kMaxWidth));
  PRAXIS_RETURN_IF_ERROR(Need(e.video_in_c_in % patch == 0, kDivisible));
  PRAXIS_RETURN_IF_ERROR(
      Need(d.video_in_c_in == e.video_in_c_in / patch,
           "decoder.video_in.c_in must equal encoder.video_in.c_in / (ph * pw)"));
  return Need(d.video_out_c_out == d.video_in_c_in,
              "decoder.video_out.c_out must equal decoder.video_in.c_in");
}

}  // namespace

absl::Status ValidateConfigValues(const BackboneConfig& config) {
  PRAXIS_RETURN_IF_ERROR(ValidateTrunk(config));
  return ValidateTowers(config);
}

}  // namespace praxis::model
