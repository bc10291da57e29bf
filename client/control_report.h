#pragma once

// The report of praxis-load's control-loop mode, made from the measured CallRecords: goodput,
// starvation per robot, latency distributions, the server's queue/compute split, and its text and
// JSON forms. The JSON schema is documented in client/README.md ("Control-loop report").

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/control_loop.h"
#include "client/robot_search.h"

namespace praxis::client {

// The distribution of one metric, with the fields of AIPerf's profile_export_aiperf.json (plus
// count and p99.9). Percentiles are nearest-rank; std is the population standard deviation.
struct MetricStats {
  std::string unit;
  int64_t count = 0;
  double avg = 0, std = 0, min = 0, max = 0;
  double p1 = 0, p5 = 0, p10 = 0, p25 = 0, p50 = 0, p75 = 0, p90 = 0, p95 = 0, p99 = 0, p999 = 0;
};

// The statistics of `values` in `unit`; all zero but the unit when empty.
MetricStats Stats(std::vector<double> values, std::string unit);

// What a run was: the command line, the seed and the resolved settings, for the report.
struct ControlRunInfo {
  std::string command_line;
  uint64_t seed = 0;
  std::string address;
  int robots = 0;
  ControlLoopOptions loop;
  std::string pass_mode;  // batched | separate
  std::string transport;  // session | unary
  std::string mix;
  int connections = 0;
  absl::Duration warmup;
  absl::Time start, measure_from, end;     // end: of the measured window
  std::vector<std::string> robot_layouts;  // robot i's layout (mix entry name)
};

// One robot's measured calls by fate, and its starvation.
struct RobotSummary {
  int robot = 0;
  std::string layout;
  int64_t calls = 0, on_time = 0, late = 0, failed = 0, skipped = 0;
  absl::Duration starvation = absl::ZeroDuration();
  double starvation_fraction = 0;  // of the measured window
};

// The whole control-loop report. Value type; not thread-safe.
struct ControlLoopReport {
  ControlRunInfo info;
  int64_t calls = 0, on_time = 0, late = 0, failed = 0, skipped = 0;
  double goodput = 0;  // on_time / calls; 0 without calls
  int64_t messages = 0, message_errors = 0;
  int64_t first_call_failures = 0;  // robots whose untimed first call failed (set by RunFleet)
  int64_t forwards = 0;             // rows of the OK messages: one per pass and step
  absl::Duration starvation;        // summed over robots
  double starvation_fraction = 0;   // starvation / (robots × measured window)
  MetricStats call_latency;         // due → done, OK calls
  MetricStats message_latency;      // intended → done, OK messages
  MetricStats message_send_delay;   // intended → sent, sent messages
  MetricStats message_service;      // sent → done, OK messages
  MetricStats server_queue;         // server-reported, OK messages
  MetricStats server_compute;
  MetricStats message_other;     // service - queue - compute: network, codec, client
  MetricStats batch_rows;        // rows of the server batch each OK message ran in
  MetricStats robot_starvation;  // one value per robot, seconds
  double queue_share = 0, compute_share = 0, other_share = 0;  // of the summed service time
  std::map<std::string, int64_t> message_codes;                // by status code name, sent messages
  std::vector<RobotSummary> robots;
  std::optional<RobotSearchResult> search;  // with --find_max_robots

  double measured_s() const { return absl::ToDoubleSeconds(info.end - info.measure_from); }
  // The human summary printed to stdout.
  std::string Text() const;
  // The JSON document (client/README.md, "Control-loop report").
  std::string Json() const;
};

// The report of the measured `calls` (ControlRecorder::Calls) of the run `info` describes.
ControlLoopReport BuildControlReport(const std::vector<CallRecord>& calls, ControlRunInfo info);

}  // namespace praxis::client
