#pragma once

// Upper bounds on a backbone config, beyond the reference's checks: config.json may come with a
// checkpoint from an untrusted hub, and no size it names may overflow int64 or make weight
// allocation explode. Each bound is far above any real model (praxis-1: dim 2048, ffn_dim 8192,
// 64 experts, depth 34).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/config.h"

namespace praxis::model {

inline constexpr int64_t kMaxWidth = int64_t{1} << 17;  // any width, channel or ffn/expert dim,
                                                        // and unpatch_factor's product
inline constexpr int64_t kMaxDepth = 1024;              // blocks per tower
inline constexpr int64_t kMaxExperts = 4096;
inline constexpr int64_t kMaxRegisters = 4096;
inline constexpr int64_t kMaxBlockSize = 1024;                   // attention.flex_block_size
inline constexpr int64_t kMaxPositionOffset = int64_t{1} << 20;  // |text_position_offset|, ...
inline constexpr int64_t kMaxParameters = int64_t{1} << 38;      // ~275e9, in all

// The bounds above, each refused with InvalidArgument naming its key ("backbone.dim: 1099511627776
// exceeds the limit of 131072"), then the total ParameterCount. `config` must have passed the
// reference's checks (positive sizes, moe_blocks in range and distinct). Pure, thread-safe.
absl::Status ValidateConfigBounds(const BackboneConfig& config);

// The number of parameters `config` describes (the elements of every tensor of
// ExpectedParameters), with checked arithmetic. InvalidArgument when it overflows int64. `config`
// must have passed the reference's checks. Pure, thread-safe.
absl::StatusOr<int64_t> ParameterCount(const BackboneConfig& config);

}  // namespace praxis::model
