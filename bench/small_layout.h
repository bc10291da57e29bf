#pragma once

// The benchmarks' small layout beside model::kBenchLayout: one place for the binaries that time
// both (model_bench, serve_bench, gpu_bench). Header-only constants.

#include "model/masks.h"

namespace praxis::bench {

// praxis-load's --mix 32,6,8,2,1 (and the Python scripts' "small"): anchor 6x8, text 32, K = 2,
// F = 1, h x w = 6 x 8, registers left 0 (a model adds its config's, as for a step): with the
// bench config's 4, 228 encoder and 388 decoder tokens.
inline constexpr model::WindowLayout kSmallLayout{
    .anchor_h = 6, .anchor_w = 8, .text_len = 32, .k = 2, .f = 1, .h = 6, .w = 8};

}  // namespace praxis::bench
