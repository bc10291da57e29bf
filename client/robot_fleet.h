#pragma once

// praxis-load's control-loop mode against a real server: N robots, each on its own thread with
// its own Session (or unary calls), running the schedule of client/control_loop.h for a measured
// window, and the report of the run.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/control_loop.h"
#include "client/control_report.h"
#include "client/praxis_client.h"
#include "praxis/v1/praxis.pb.h"

namespace praxis::client {

// How the passes of one step travel: one request of `passes` rows, or `passes` one-row requests
// sent at the same time (one Session per pass, or concurrent unary calls).
enum class PassMode { kBatched, kSeparate };

// "batched" | "separate" (--pass_mode); InvalidArgument naming the flag otherwise.
absl::StatusOr<PassMode> ParsePassMode(const std::string& name);

// One layout a robot may have: its request with every pass as a row, and with one row.
struct RobotLayout {
  std::string name;
  double weight = 1;
  v1::StepRequest batched;  // `passes` rows
  v1::StepRequest single;   // 1 row
};

// Everything a fleet run needs but the number of robots.
struct FleetOptions {
  std::string address;
  ClientOptions client;     // max_attempts is forced to 1: every failure shows
  int min_connections = 1;  // at least one connection per 32 streams is opened regardless
  ControlLoopOptions loop;
  PassMode pass_mode = PassMode::kBatched;
  Transport transport = Transport::kSession;
  absl::Duration warmup = absl::Seconds(1);         // schedule run before the measured window
  absl::Duration duration = absl::Seconds(10);      // the measured window (>= one buffer period)
  absl::Duration call_timeout = absl::Seconds(60);  // of each unary call, and each first call
  absl::Duration progress_interval = absl::Seconds(1);  // of the stderr line; 0: none
  uint64_t seed = 0;  // picks each robot's layout and the phase of its schedule
  std::vector<RobotLayout> layouts;
  ControlRunInfo info;  // command line, mix text; the rest is filled by RunFleet

  // InvalidArgument naming the flag that is out of range.
  absl::Status Validate() const;
};

// Runs `robots` robots against options.address: each opens its stream(s), makes one untimed first
// call (a robot needs a chunk before it can move), and once all have, runs its schedule from a
// phase drawn from the seed, for warmup + duration. Blocks until every robot has stopped (at most
// about one buffer period after the window, or call_timeout for a first call). Errors: connection
// set-up failures; a server's refusals are counted in the report, never returned.
// Thread-compatible: one run at a time per FleetOptions.
absl::StatusOr<ControlLoopReport> RunFleet(int robots, const FleetOptions& options);

}  // namespace praxis::client
