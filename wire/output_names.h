#pragma once

// The names a step's outputs stream under (StepHeader.tensors[].name), in the order the server
// sends them: velocity, cond, tap.0 …, embeddings, positions. The one list for C++; Python's is
// client/python/praxis_client/request.py.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace praxis::wire {

inline constexpr char kVelocity[] = "velocity";
inline constexpr char kCond[] = "cond";
inline constexpr char kEmbeddings[] = "embeddings";
inline constexpr char kPositions[] = "positions";
// Asks for every tap in an output list; each tap then streams as TapName(i).
inline constexpr char kAllTaps[] = "taps";

// What every tap's name starts with; the tap's index follows.
inline constexpr absl::string_view kTapPrefix = "tap.";

// The streamed name of the i-th encoder tap.
inline std::string TapName(int i) { return absl::StrCat(kTapPrefix, i); }

}  // namespace praxis::wire
