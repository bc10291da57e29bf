#include "client/control_mode.h"

#include <cstdio>
#include <iostream>
#include <optional>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "client/robot_search.h"
#include "common/file_util.h"
#include "common/status_macros.h"

ABSL_FLAG(int, robots, 0,
          "control-loop mode: robots, each running its own control loop (with --find_max_robots, "
          "the first probe; 0 there means 1)");
ABSL_FLAG(double, hz, 15, "control-loop mode: actions each robot executes per second");
ABSL_FLAG(int, chunk_actions, 24,
          "control-loop mode: actions one control call returns; a call must finish within "
          "chunk_actions / hz seconds of being due");
ABSL_FLAG(int, steps, 2, "control-loop mode: Euler steps per control call, one after the other");
ABSL_FLAG(int, passes, 2, "control-loop mode: forwards per step (guided + unguided)");
ABSL_FLAG(std::string, pass_mode, "batched",
          "control-loop mode: batched (one request of `passes` rows per step) | separate "
          "(`passes` one-row requests at once)");
ABSL_DECLARE_FLAG(std::string, transport);  // praxis_load.cc: every mode's
ABSL_FLAG(uint64_t, seed, 0, "control-loop mode: seed of the robots' layouts and schedule phases");
ABSL_FLAG(bool, find_max_robots, false,
          "control-loop mode: search the largest fleet keeping --goodput_target (doubling from "
          "--robots, then bisection; each probe runs --warmup + --duration)");
ABSL_FLAG(int, max_robots, 256, "control-loop mode: the most robots --find_max_robots probes");
ABSL_FLAG(double, goodput_target, 0.99,
          "control-loop mode: the on-time fraction --find_max_robots requires");

namespace praxis::client {
namespace {

absl::StatusOr<std::vector<RobotLayout>> Layouts(const MixMaker& mix, int passes) {
  PRAXIS_ASSIGN_OR_RETURN(const std::vector<MixEntry> batched, mix(passes));
  PRAXIS_ASSIGN_OR_RETURN(const std::vector<MixEntry> single, mix(1));
  std::vector<RobotLayout> layouts;
  for (size_t i = 0; i < batched.size(); ++i) {
    layouts.push_back({batched[i].name, batched[i].weight, batched[i].request, single[i].request});
  }
  return layouts;
}

absl::Status FillFromFlags(FleetOptions& o, const MixMaker& mix) {
  o.loop.hz = absl::GetFlag(FLAGS_hz);
  o.loop.chunk_actions = absl::GetFlag(FLAGS_chunk_actions);
  o.loop.steps = absl::GetFlag(FLAGS_steps);
  o.loop.passes = absl::GetFlag(FLAGS_passes);
  PRAXIS_RETURN_IF_ERROR(o.loop.Validate());
  PRAXIS_ASSIGN_OR_RETURN(o.pass_mode, ParsePassMode(absl::GetFlag(FLAGS_pass_mode)));
  PRAXIS_ASSIGN_OR_RETURN(o.transport,
                          ParseTransport(absl::GetFlag(FLAGS_transport), Transport::kSession));
  o.seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_robots) < 0) {
    return absl::InvalidArgumentError("--robots: expected >= 0");
  }
  PRAXIS_ASSIGN_OR_RETURN(o.layouts, Layouts(mix, o.loop.passes));
  return o.Validate();
}

// One probe of the search: a fleet run, its line on stderr, and the best passing report kept.
absl::StatusOr<RobotProbe> Probe(int robots, const FleetOptions& o, double target,
                                 std::optional<ControlLoopReport>& best,
                                 std::optional<ControlLoopReport>& smallest) {
  std::fprintf(stderr, "praxis-load: probing %d robot(s)\n", robots);
  PRAXIS_ASSIGN_OR_RETURN(ControlLoopReport r, RunFleet(robots, o));
  std::fprintf(
      stderr, "praxis-load: %d robot(s): goodput %.2f %% (%lld calls), starvation %.2f %%\n",
      robots, 100 * r.goodput, static_cast<long long>(r.calls), 100 * r.starvation_fraction);
  const RobotProbe p{.robots = robots,
                     .goodput = r.goodput,
                     .calls = r.calls,
                     .starvation_fraction = r.starvation_fraction,
                     .message_latency_p99_ms = r.message_latency.p99};
  if (!smallest || robots < smallest->info.robots) smallest = r;
  if (r.goodput >= target && (!best || robots > best->info.robots)) best = std::move(r);
  return p;
}

// The search's report: the largest passing probe's, else the smallest probe's, with the search.
absl::StatusOr<ControlLoopReport> Search(const FleetOptions& o) {
  RobotSearchOptions s;
  s.start = std::max(1, absl::GetFlag(FLAGS_robots));
  s.cap = absl::GetFlag(FLAGS_max_robots);
  s.target = absl::GetFlag(FLAGS_goodput_target);
  PRAXIS_RETURN_IF_ERROR(s.Validate());
  std::optional<ControlLoopReport> best, smallest;
  PRAXIS_ASSIGN_OR_RETURN(
      RobotSearchResult result,
      FindMaxRobots([&](int n) { return Probe(n, o, s.target, best, smallest); }, s));
  ControlLoopReport report = best ? std::move(*best) : std::move(*smallest);
  report.search = std::move(result);
  return report;
}

}  // namespace

bool ControlModeRequested() {
  return absl::GetFlag(FLAGS_robots) != 0 || absl::GetFlag(FLAGS_find_max_robots);
}

absl::Status RunControlMode(FleetOptions base, const MixMaker& mix, const std::string& json_path) {
  PRAXIS_RETURN_IF_ERROR(FillFromFlags(base, mix));
  std::cerr << absl::StrFormat(
      "praxis-load: control loop, %s, %s robot(s), %g Hz, %d-action chunks, %d x %d forwards "
      "(%s, %s), warm-up %s, duration %s\n",
      base.address,
      absl::GetFlag(FLAGS_find_max_robots)
          ? absl::StrFormat("searching %d..%d", std::max(1, absl::GetFlag(FLAGS_robots)),
                            absl::GetFlag(FLAGS_max_robots))
          : absl::StrCat(absl::GetFlag(FLAGS_robots)),
      base.loop.hz, base.loop.chunk_actions, base.loop.steps, base.loop.passes,
      absl::GetFlag(FLAGS_pass_mode), TransportName(base.transport),
      absl::FormatDuration(base.warmup), absl::FormatDuration(base.duration));
  absl::StatusOr<ControlLoopReport> report = absl::GetFlag(FLAGS_find_max_robots)
                                                 ? Search(base)
                                                 : RunFleet(absl::GetFlag(FLAGS_robots), base);
  PRAXIS_RETURN_IF_ERROR(report.status());
  std::cout << report->Text();
  if (!json_path.empty()) PRAXIS_RETURN_IF_ERROR(WriteStringToFile(json_path, report->Json()));
  return absl::OkStatus();
}

}  // namespace praxis::client
