#include "client/load_stats.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace praxis::client {
namespace {

// Log-spaced buckets from the fastest to the slowest OK request, one line each.
std::string TextHistogram(const std::vector<double>& ms) {
  if (ms.empty()) return "  (no successful requests)\n";
  const auto [lo_it, hi_it] = std::minmax_element(ms.begin(), ms.end());
  const double lo = std::max(*lo_it, 1e-3), hi = std::max(*hi_it, lo * 1.0001);
  constexpr int kBuckets = 12;
  std::vector<int64_t> counts(kBuckets, 0);
  const double step = std::log(hi / lo) / kBuckets;
  for (double v : ms) {
    const int b = static_cast<int>(std::log(std::max(v, lo) / lo) / step);
    ++counts[std::clamp(b, 0, kBuckets - 1)];
  }
  const int64_t peak = *std::max_element(counts.begin(), counts.end());
  std::string out;
  for (int b = 0; b < kBuckets; ++b) {
    const double upper = lo * std::exp(step * (b + 1));
    const int bar = static_cast<int>(40.0 * counts[b] / peak);
    absl::StrAppendFormat(&out, "  <= %10.3f ms %8d |%s\n", upper, counts[b],
                          std::string(bar, '#'));
  }
  return out;
}

nlohmann::json SummaryJson(const LatencySummary& s) {
  return {{"count", s.count}, {"min", s.min}, {"mean", s.mean},  {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99}, {"p99.9", s.p999}, {"max", s.max}};
}

std::string SummaryText(const char* name, const LatencySummary& s) {
  return absl::StrFormat(
      "  %-15s min %.3f  mean %.3f  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f ms\n", name,
      s.min, s.mean, s.p50, s.p90, s.p99, s.p999, s.max);
}

}  // namespace

double NearestRank(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = static_cast<size_t>(std::ceil(q * sorted.size())) - (q > 0 ? 1 : 0);
  return sorted[std::min(i, sorted.size() - 1)];
}

LatencySummary Summarize(std::vector<double> ms) {
  LatencySummary s;
  s.count = static_cast<int64_t>(ms.size());
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.min = ms.front();
  s.max = ms.back();
  s.mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  s.p50 = NearestRank(ms, 0.5);
  s.p90 = NearestRank(ms, 0.9);
  s.p99 = NearestRank(ms, 0.99);
  s.p999 = NearestRank(ms, 0.999);
  return s;
}

void Recorder::Add(Sample s) {
  absl::MutexLock lock(&mu_);
  if (s.start < measure_from_) {
    ++warmup_;
  } else {
    measured_.push_back(std::move(s));
  }
}

Recorder::Progress Recorder::Snapshot() const {
  std::vector<double> ok;
  Progress p;
  {
    absl::MutexLock lock(&mu_);
    p.done = static_cast<int64_t>(measured_.size());
    for (const Sample& s : measured_) {
      if (s.code == absl::StatusCode::kOk) {
        ok.push_back(absl::ToDoubleMilliseconds(s.latency));
      } else {
        ++p.errors;
      }
    }
  }
  const LatencySummary l = Summarize(std::move(ok));
  p.p50_ms = l.p50;
  p.p99_ms = l.p99;
  return p;
}

LoadReport Recorder::Report(absl::Time end) const {
  LoadReport r;
  {
    absl::MutexLock lock(&mu_);
    r.samples = measured_;
  }
  std::vector<double> latency, queue, compute;
  for (const Sample& s : r.samples) {
    ++r.codes[absl::StatusCodeToString(s.code)];
    ++r.by_layout[s.layout];
    if (s.code != absl::StatusCode::kOk) continue;
    latency.push_back(absl::ToDoubleMilliseconds(s.latency));
    queue.push_back(s.queue_us / 1e3);
    compute.push_back(s.compute_us / 1e3);
  }
  r.sent = static_cast<int64_t>(r.samples.size());
  r.ok = static_cast<int64_t>(latency.size());
  r.errors = r.sent - r.ok;
  r.elapsed_s = std::max(1e-9, absl::ToDoubleSeconds(end - measure_from_));
  r.throughput = r.ok / r.elapsed_s;
  r.histogram = TextHistogram(latency);
  r.latency = Summarize(std::move(latency));
  r.server_queue = Summarize(std::move(queue));
  r.server_compute = Summarize(std::move(compute));
  return r;
}

std::string LoadReport::Text() const {
  std::string out =
      absl::StrFormat("Summary\n  measured %.2f s: %d requests, %d OK, %d errors, %.2f OK/s\n",
                      elapsed_s, sent, ok, errors, throughput);
  out += "Latency (OK requests)\n";
  out += SummaryText("end-to-end", latency);
  out += SummaryText("server queue", server_queue);
  out += SummaryText("server compute", server_compute);
  out += "Status codes\n";
  for (const auto& [code, n] : codes) absl::StrAppendFormat(&out, "  %-20s %d\n", code, n);
  out += "Layouts\n";
  for (const auto& [layout, n] : by_layout) absl::StrAppendFormat(&out, "  %-20s %d\n", layout, n);
  out += "Histogram (end-to-end, OK)\n" + histogram;
  return out;
}

std::string LoadReport::Json() const {
  nlohmann::json j = {{"elapsed_s", elapsed_s},
                      {"sent", sent},
                      {"ok", ok},
                      {"errors", errors},
                      {"throughput_rps", throughput},
                      {"latency_ms", SummaryJson(latency)},
                      {"server_queue_ms", SummaryJson(server_queue)},
                      {"server_compute_ms", SummaryJson(server_compute)},
                      {"codes", codes},
                      {"layouts", by_layout}};
  return j.dump(2) + "\n";
}

std::string LoadReport::Csv() const {
  std::string out = "start_s,latency_ms,code,server_queue_ms,server_compute_ms,layout\n";
  const absl::Time t0 = samples.empty() ? absl::UnixEpoch() : samples.front().start;
  for (const Sample& s : samples) {
    absl::StrAppendFormat(&out, "%.6f,%.3f,%s,%.3f,%.3f,%s\n", absl::ToDoubleSeconds(s.start - t0),
                          absl::ToDoubleMilliseconds(s.latency), absl::StatusCodeToString(s.code),
                          s.queue_us / 1e3, s.compute_us / 1e3, s.layout);
  }
  return out;
}

}  // namespace praxis::client
