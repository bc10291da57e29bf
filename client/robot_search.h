#pragma once

// praxis-load --find_max_robots: the largest fleet whose control calls keep a goodput target,
// found by doubling and then bisection over probes of real runs. Pure logic: the probe is given.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"

namespace praxis::client {

// The search's bounds and target.
struct RobotSearchOptions {
  int start = 1;         // robots of the first probe (--robots)
  int cap = 256;         // most robots ever probed (--max_robots)
  double target = 0.99;  // goodput a fleet must keep (--goodput_target)

  // InvalidArgument naming --robots, --max_robots or --goodput_target when out of range.
  absl::Status Validate() const;
};

// One probe: a run with `robots` robots, the goodput it kept (which the search reads) and figures
// for the report.
struct RobotProbe {
  int robots = 0;
  double goodput = 0;
  int64_t calls = 0;
  double starvation_fraction = 0;
  double message_latency_p99_ms = 0;
};

struct RobotSearchResult {
  RobotSearchOptions options;
  int max_robots = 0;              // the largest probed fleet that kept the target; 0 if none did
  bool capped = false;             // the cap itself kept it: the real limit may be higher
  std::vector<RobotProbe> probes;  // in the order run
};

// Runs `probe` (robots → its goodput and figures) on start, 2·start, 4·start … (at most cap) until
// one misses the target, then bisects between the largest that kept it and the smallest that
// missed, until they are adjacent. At most about 2·log2(cap) + 2 probes. Assumes goodput falls as
// the fleet grows (a noisy probe can make the answer off by the noise). Returns the probe's first
// error. Thread-compatible: calls `probe` on the calling thread, one at a time.
absl::StatusOr<RobotSearchResult> FindMaxRobots(
    const std::function<absl::StatusOr<RobotProbe>(int robots)>& probe,
    const RobotSearchOptions& options);

}  // namespace praxis::client
