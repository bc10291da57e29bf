#pragma once

// The layout key — which steps may share a batch, and so one cached mask — and the text forms of
// a layout and of rope shifts that the programs' flags take. The key is a wire contract: the
// server returns it, clients send it as a routing header, and Python computes the same string
// (client/python/praxis_client/request.py; tests/client/test_layout_header.py checks both).

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "wire/step_inputs.h"

namespace praxis::wire {

// The header a proxy hashes on to send one layout's steps to one replica (deploy/affinity).
inline constexpr char kLayoutHeader[] = "x-praxis-layout";

// Steps with equal keys have the same sequence layout (text length, anchor and video grid, K, F,
// decode, rope shifts), so their rows stack into one batch that shares both towers' masks and
// rotary tables. Human-readable: it is returned to clients and used in logs.
std::string LayoutKey(const StepGeometry& geometry, bool decode,
                      const std::array<int64_t, 4>& rope_shifts);

// The key of `in`, whose shapes must have SPEC §2's ranks (see GeometryOf).
std::string LayoutKey(const StepInputs& in);

// "text_len,h,w,K,F" → the geometry with an h x w anchor and latent grid; InvalidArgument naming
// `field` (the flag or setting it came from) otherwise.
absl::StatusOr<StepGeometry> ParseLayout(absl::string_view text, absl::string_view field);

// "a,b,c,d" → the four rope shifts; InvalidArgument naming `field` otherwise.
absl::StatusOr<std::array<int64_t, 4>> ParseRopeShifts(absl::string_view text,
                                                       absl::string_view field);

}  // namespace praxis::wire
