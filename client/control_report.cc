#include "client/control_report.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/load_stats.h"

namespace praxis::client {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// The distributions of the messages, filled by AddMessage and turned into MetricStats.
struct MessageValues {
  std::vector<double> latency, send_delay, service, queue, compute, other, rows;
  double service_sum = 0, queue_sum = 0, compute_sum = 0;
};

void AddMessage(const MessageRecord& m, ControlLoopReport& r, MessageValues& v) {
  ++r.messages;
  ++r.message_codes[absl::StatusCodeToString(m.code)];
  v.send_delay.push_back(Ms(m.sent - m.intended));
  if (m.code != absl::StatusCode::kOk) {
    ++r.message_errors;
    return;
  }
  r.forwards += m.pass < 0 ? r.info.loop.passes : 1;
  const double service = Ms(m.done - m.sent);
  const double queue = m.queue_us / 1e3, compute = m.compute_us / 1e3;
  v.latency.push_back(Ms(m.done - m.intended));
  v.service.push_back(service);
  v.queue.push_back(queue);
  v.compute.push_back(compute);
  v.other.push_back(service - queue - compute);
  v.rows.push_back(static_cast<double>(m.batch_rows));
  v.service_sum += service;
  v.queue_sum += queue;
  v.compute_sum += compute;
}

void SetMessageStats(MessageValues v, ControlLoopReport& r) {
  r.message_latency = Stats(std::move(v.latency), "ms");
  r.message_send_delay = Stats(std::move(v.send_delay), "ms");
  r.message_service = Stats(std::move(v.service), "ms");
  r.server_queue = Stats(std::move(v.queue), "ms");
  r.server_compute = Stats(std::move(v.compute), "ms");
  r.message_other = Stats(std::move(v.other), "ms");
  r.batch_rows = Stats(std::move(v.rows), "rows");
  if (v.service_sum > 0) {
    r.queue_share = v.queue_sum / v.service_sum;
    r.compute_share = v.compute_sum / v.service_sum;
    r.other_share = 1 - r.queue_share - r.compute_share;
  }
}

// Counts `call` into the totals and its robot's summary; returns its latency when it arrived.
std::optional<double> AddCall(const CallRecord& call, ControlLoopReport& r) {
  const CallOutcome o = JudgeCall(call, r.info.loop.BufferPeriod(), r.info.end);
  RobotSummary& robot = r.robots[call.robot];
  ++robot.calls;
  robot.starvation += o.starvation;
  switch (o.fate) {
    case CallFate::kOnTime:
      ++robot.on_time, ++r.on_time;
      break;
    case CallFate::kLate:
      ++robot.late, ++r.late;
      break;
    case CallFate::kFailed:
      ++robot.failed, ++r.failed;
      break;
    case CallFate::kSkipped:
      ++robot.skipped, ++r.skipped;
      break;
  }
  if (o.fate == CallFate::kOnTime || o.fate == CallFate::kLate) return Ms(call.done - call.due);
  return std::nullopt;
}

void SummarizeRobots(ControlLoopReport& r) {
  const double window_s = std::max(1e-9, r.measured_s());
  std::vector<double> starvation_s;
  for (RobotSummary& robot : r.robots) {
    robot.starvation_fraction = absl::ToDoubleSeconds(robot.starvation) / window_s;
    r.starvation += robot.starvation;
    starvation_s.push_back(absl::ToDoubleSeconds(robot.starvation));
  }
  r.starvation_fraction =
      r.robots.empty() ? 0 : absl::ToDoubleSeconds(r.starvation) / (window_s * r.robots.size());
  r.robot_starvation = Stats(std::move(starvation_s), "s");
}

nlohmann::json StatsJson(const MetricStats& s) {
  nlohmann::json j = {{"unit", s.unit}, {"count", s.count}};
  const std::pair<const char*, double> fields[] = {
      {"avg", s.avg}, {"min", s.min}, {"max", s.max}, {"std", s.std},   {"p1", s.p1},
      {"p5", s.p5},   {"p10", s.p10}, {"p25", s.p25}, {"p50", s.p50},   {"p75", s.p75},
      {"p90", s.p90}, {"p95", s.p95}, {"p99", s.p99}, {"p99.9", s.p999}};
  for (const auto& [name, value] : fields) {
    j[name] = s.count > 0 ? nlohmann::json(value) : nlohmann::json(nullptr);
  }
  return j;
}

nlohmann::json Scalar(const char* unit, double value) { return {{"unit", unit}, {"avg", value}}; }

nlohmann::json RunInfoJson(const ControlRunInfo& i) {
  return {{"cli_command", i.command_line},
          {"random_seed", i.seed},
          {"address", i.address},
          {"robots", i.robots},
          {"hz", i.loop.hz},
          {"chunk_actions", i.loop.chunk_actions},
          {"buffer_period_s", absl::ToDoubleSeconds(i.loop.BufferPeriod())},
          {"steps", i.loop.steps},
          {"passes", i.loop.passes},
          {"pass_mode", i.pass_mode},
          {"transport", i.transport},
          {"mix", i.mix},
          {"connections", i.connections},
          {"warmup_s", absl::ToDoubleSeconds(i.warmup)}};
}

nlohmann::json RobotsJson(const std::vector<RobotSummary>& robots) {
  nlohmann::json out = nlohmann::json::array();
  for (const RobotSummary& r : robots) {
    out.push_back({{"robot", r.robot},
                   {"layout", r.layout},
                   {"calls", r.calls},
                   {"on_time", r.on_time},
                   {"late", r.late},
                   {"failed", r.failed},
                   {"skipped", r.skipped},
                   {"starvation_s", absl::ToDoubleSeconds(r.starvation)},
                   {"starvation_fraction", r.starvation_fraction}});
  }
  return out;
}

nlohmann::json SearchJson(const RobotSearchResult& s) {
  nlohmann::json probes = nlohmann::json::array();
  for (const RobotProbe& p : s.probes) {
    probes.push_back({{"robots", p.robots},
                      {"goodput", p.goodput},
                      {"control_call_count", p.calls},
                      {"starvation_fraction", p.starvation_fraction},
                      {"message_latency_p99_ms", p.message_latency_p99_ms}});
  }
  return {{"goodput_target", s.options.target}, {"start", s.options.start}, {"cap", s.options.cap},
          {"max_robots", s.max_robots},         {"capped", s.capped},       {"probes", probes}};
}

nlohmann::json ErrorsJson(const std::map<std::string, int64_t>& codes) {
  nlohmann::json errors = nlohmann::json::array();
  for (const auto& [code, n] : codes) {
    if (code != "OK") errors.push_back({{"code", code}, {"count", n}});
  }
  return errors;
}

std::string TextRow(const char* name, const MetricStats& s) {
  if (s.count == 0) return absl::StrFormat("  %-26s %7d\n", name, 0);
  return absl::StrFormat("  %-26s %7d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f\n", name, s.count,
                         s.avg, s.min, s.p50, s.p90, s.p99, s.p999, s.max);
}

std::string SearchText(const RobotSearchResult& s) {
  std::string out = absl::StrFormat(
      "Fleet search (goodput >= %.2f %%, %d..%d robots): largest fleet %d%s; the figures above "
      "are %s\n",
      100 * s.options.target, s.options.start, s.options.cap, s.max_robots,
      s.capped ? " (the cap: the limit may be higher)" : "",
      s.max_robots > 0 ? "its probe's" : "the smallest probe's");
  for (const RobotProbe& p : s.probes) {
    absl::StrAppendFormat(&out,
                          "  %4d robots: goodput %6.2f %%, %5d calls, starvation %.2f %%, "
                          "message p99 %.3f ms\n",
                          p.robots, 100 * p.goodput, p.calls, 100 * p.starvation_fraction,
                          p.message_latency_p99_ms);
  }
  return out;
}

}  // namespace

MetricStats Stats(std::vector<double> values, std::string unit) {
  MetricStats s;
  s.unit = std::move(unit);
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  s.avg = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  double squares = 0;
  for (double v : values) squares += (v - s.avg) * (v - s.avg);
  s.std = std::sqrt(squares / values.size());
  const std::pair<double*, double> quantiles[] = {
      {&s.p1, 0.01},  {&s.p5, 0.05},  {&s.p10, 0.10}, {&s.p25, 0.25}, {&s.p50, 0.50},
      {&s.p75, 0.75}, {&s.p90, 0.90}, {&s.p95, 0.95}, {&s.p99, 0.99}, {&s.p999, 0.999}};
  for (const auto& [field, q] : quantiles) *field = NearestRank(values, q);
  return s;
}

ControlLoopReport BuildControlReport(const std::vector<CallRecord>& calls, ControlRunInfo info) {
  ControlLoopReport r;
  r.info = std::move(info);
  r.robots.resize(r.info.robots);
  for (int i = 0; i < r.info.robots; ++i) {
    r.robots[i].robot = i;
    if (i < static_cast<int>(r.info.robot_layouts.size()))
      r.robots[i].layout = r.info.robot_layouts[i];
  }
  std::vector<double> call_latency;
  MessageValues values;
  for (const CallRecord& call : calls) {
    if (std::optional<double> ms = AddCall(call, r)) call_latency.push_back(*ms);
    for (const MessageRecord& m : call.messages) AddMessage(m, r, values);
  }
  r.calls = static_cast<int64_t>(calls.size());
  r.goodput = r.calls > 0 ? static_cast<double>(r.on_time) / r.calls : 0;
  r.call_latency = Stats(std::move(call_latency), "ms");
  SetMessageStats(std::move(values), r);
  SummarizeRobots(r);
  return r;
}

std::string ControlLoopReport::Text() const {
  const ControlLoopOptions& l = info.loop;
  std::string out = absl::StrFormat(
      "Control loop: %d robot(s) at %g Hz, %d-action chunks (buffer %.3f s), %d step(s) x %d "
      "pass(es), %s passes over %s\n",
      info.robots, l.hz, l.chunk_actions, absl::ToDoubleSeconds(l.BufferPeriod()), l.steps,
      l.passes, info.pass_mode, info.transport);
  absl::StrAppendFormat(&out,
                        "  measured %.2f s: %d calls: %d on time, %d late, %d failed, %d skipped; "
                        "goodput %.2f %%\n",
                        measured_s(), calls, on_time, late, failed, skipped, 100 * goodput);
  absl::StrAppendFormat(
      &out, "  starvation %.3f s in all (%.2f %% of robot time), worst robot %.3f s\n",
      absl::ToDoubleSeconds(starvation), 100 * starvation_fraction, robot_starvation.max);
  absl::StrAppendFormat(&out, "  %d messages (%d errors), %d forwards, %.1f forwards/s\n", messages,
                        message_errors, forwards, forwards / std::max(1e-9, measured_s()));
  absl::StrAppendFormat(&out, "  %-26s %7s %9s %9s %9s %9s %9s %9s %9s\n", "Latency (ms)", "count",
                        "avg", "min", "p50", "p90", "p99", "p99.9", "max");
  out += TextRow("control call (from due)", call_latency);
  out += TextRow("message (from intended)", message_latency);
  out += TextRow("message send delay", message_send_delay);
  out += TextRow("message service", message_service);
  out += TextRow("  server queue", server_queue);
  out += TextRow("  server compute", server_compute);
  out += TextRow("  other (network, client)", message_other);
  out += TextRow("server batch rows", batch_rows);
  absl::StrAppendFormat(&out,
                        "  server split of service time: queue %.1f %%, compute %.1f %%, "
                        "other %.1f %%\n",
                        100 * queue_share, 100 * compute_share, 100 * other_share);
  for (const auto& [code, n] : message_codes) absl::StrAppendFormat(&out, "  %-26s %7d\n", code, n);
  if (search) out += SearchText(*search);
  return out;
}

std::string ControlLoopReport::Json() const {
  const double window_s = std::max(1e-9, measured_s());
  nlohmann::json j = {
      {"goodput", Scalar("ratio", goodput)},
      {"control_call_count", Scalar("calls", calls)},
      {"on_time_call_count", Scalar("calls", on_time)},
      {"late_call_count", Scalar("calls", late)},
      {"failed_call_count", Scalar("calls", failed)},
      {"skipped_call_count", Scalar("calls", skipped)},
      {"message_count", Scalar("messages", messages)},
      {"error_message_count", Scalar("messages", message_errors)},
      {"first_call_failure_count", Scalar("robots", first_call_failures)},
      {"control_call_throughput", Scalar("calls/sec", calls / window_s)},
      {"forward_throughput", Scalar("forwards/sec", forwards / window_s)},
      {"starvation_time_total", Scalar("s", absl::ToDoubleSeconds(starvation))},
      {"starvation_fraction", Scalar("ratio", starvation_fraction)},
      {"benchmark_duration", Scalar("sec", measured_s())},
      {"server_time_split",
       {{"unit", "ratio"},
        {"queue", queue_share},
        {"compute", compute_share},
        {"other", other_share}}},
      {"robots", RobotsJson(robots)},
      {"input_config", RunInfoJson(info)},
      {"start_time", absl::FormatTime(absl::RFC3339_full, info.measure_from, absl::UTCTimeZone())},
      {"end_time", absl::FormatTime(absl::RFC3339_full, info.end, absl::UTCTimeZone())},
      {"error_summary", ErrorsJson(message_codes)}};
  const std::pair<const char*, const MetricStats*> distributions[] = {
      {"control_call_latency", &call_latency},     {"message_latency", &message_latency},
      {"message_send_delay", &message_send_delay}, {"message_service_time", &message_service},
      {"server_queue_time", &server_queue},        {"server_compute_time", &server_compute},
      {"message_other_time", &message_other},      {"server_batch_rows", &batch_rows},
      {"robot_starvation_time", &robot_starvation}};
  for (const auto& [name, stats] : distributions) j[name] = StatsJson(*stats);
  if (search) j["max_robots_search"] = SearchJson(*search);
  return j.dump(2) + "\n";
}

}  // namespace praxis::client
