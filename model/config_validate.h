#pragma once

// The reference's consistency checks of a backbone config (its `_validate`), apart from reading
// config.json (model/config.cc) and from our upper bounds (model/config_bounds.h).

#include "absl/status/status.h"
#include "model/config.h"

namespace praxis::model {

// Widths, heads, dtypes, the MoE, then how the towers fit together (taps, text width, the
// decoder's unpatch of the latents): the reference's checks in its order, the first failure
// returned as InvalidArgument "backbone: <what>". `config` holds the fields as read, unchecked;
// the one product computed (unpatch_factor's) is overflow-checked. Pure, thread-safe.
absl::Status ValidateConfigValues(const BackboneConfig& config);

}  // namespace praxis::model
