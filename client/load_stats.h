#pragma once

// What praxis-load measures and reports: one sample per finished request, and the summary,
// text histogram, JSON and CSV made from them.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace praxis::client {

// One finished request.
struct Sample {
  absl::Time start;        // when it was due (open loop) or sent (closed loop)
  absl::Duration latency;  // start → last byte or error
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t queue_us = 0;  // as the server reported (OK only)
  int64_t compute_us = 0;
  std::string layout;  // the mix entry's name
};

// Order statistics of a set of durations, in milliseconds.
struct LatencySummary {
  int64_t count = 0;
  double min = 0, mean = 0, p50 = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
};
LatencySummary Summarize(std::vector<double> ms);
// The nearest-rank q-quantile (0 <= q <= 1) of `sorted` (ascending); 0 when empty.
double NearestRank(const std::vector<double>& sorted, double q);

// The whole report of a run: figures over the measured samples (warm-up excluded).
struct LoadReport {
  double elapsed_s = 0;  // of the measured window
  int64_t sent = 0;      // measured requests
  int64_t ok = 0;
  int64_t errors = 0;
  double throughput = 0;        // OK per second
  LatencySummary latency;       // OK requests, end to end at the client
  LatencySummary server_queue;  // OK requests, server-reported
  LatencySummary server_compute;
  std::map<std::string, int64_t> codes;  // "OK", "RESOURCE_EXHAUSTED", ...
  std::map<std::string, int64_t> by_layout;
  std::string histogram;  // text histogram of the OK latencies
  std::vector<Sample> samples;

  std::string Text() const;
  std::string Json() const;
  // One row per measured sample: start offset, latency, code, server queue and compute, layout.
  std::string Csv() const;
};

// Thread-safe sink of samples; warm-up samples are kept apart.
class Recorder {
 public:
  explicit Recorder(absl::Time measure_from) : measure_from_(measure_from) {}
  void Add(Sample s);
  // Measured samples finished so far: count, errors and the OK latencies (for the progress line).
  struct Progress {
    int64_t done = 0, errors = 0;
    double p50_ms = 0, p99_ms = 0;
  };
  Progress Snapshot() const;
  LoadReport Report(absl::Time end) const;

 private:
  const absl::Time measure_from_;
  mutable absl::Mutex mu_;
  std::vector<Sample> measured_ ABSL_GUARDED_BY(mu_);
  int64_t warmup_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace praxis::client
