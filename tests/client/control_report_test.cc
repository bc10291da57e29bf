// praxis-load's control-loop report from synthetic calls: goodput and starvation agree with the
// calls' fates, per robot and in all; the distributions; the JSON schema of client/README.md.

#include "client/control_report.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace praxis::client {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const absl::Duration kPeriod = absl::Milliseconds(1600);
absl::Duration Ms(double ms) { return absl::Milliseconds(ms); }

TEST(StatsTest, NearestRankPercentilesMeanAndStd) {
  std::vector<double> v;
  for (int i = 1000; i >= 1; --i) v.push_back(i);
  const MetricStats s = Stats(v, "ms");
  EXPECT_EQ(s.unit, "ms");
  EXPECT_EQ(s.count, 1000);
  EXPECT_DOUBLE_EQ(s.avg, 500.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 1000);
  const double want[] = {10, 50, 100, 250, 500, 750, 900, 950, 990, 999};
  const double got[] = {s.p1, s.p5, s.p10, s.p25, s.p50, s.p75, s.p90, s.p95, s.p99, s.p999};
  for (int i = 0; i < 10; ++i) EXPECT_DOUBLE_EQ(got[i], want[i]) << i;
  EXPECT_DOUBLE_EQ(Stats({2, 4, 4, 4, 5, 5, 7, 9}, "x").std, 2);
  EXPECT_EQ(Stats({}, "s").count, 0);
}

// One message of a call: `latency` after `intended`, sent `delay` after it.
MessageRecord Message(absl::Time intended, double delay_ms, double latency_ms, int64_t queue_us,
                      int64_t compute_us, absl::StatusCode code = absl::StatusCode::kOk) {
  return {.step = 0,
          .pass = -1,
          .intended = intended,
          .sent = intended + Ms(delay_ms),
          .done = intended + Ms(latency_ms),
          .code = code,
          .queue_us = queue_us,
          .compute_us = compute_us,
          .batch_rows = 2};
}

CallRecord Call(int robot, int k, double latency_ms, absl::StatusCode code, bool sent = true) {
  CallRecord c;
  c.robot = robot;
  c.index = k;
  c.due = kT0 + k * kPeriod;
  c.deadline = c.due + kPeriod;
  c.sent = sent;
  c.done = c.due + Ms(latency_ms);
  c.code = code;
  if (sent) c.messages.push_back(Message(c.due, 0, latency_ms, 1000, 8000, code));
  return c;
}

// Robot 0: on time, on time, late by 400 ms. Robot 1: on time, failed, skipped.
ControlLoopReport Report() {
  const absl::StatusCode ok = absl::StatusCode::kOk;
  const std::vector<CallRecord> calls = {Call(0, 0, 10, ok),
                                         Call(0, 1, 20, ok),
                                         Call(0, 2, 2000, ok),
                                         Call(1, 0, 30, ok),
                                         Call(1, 1, 50, absl::StatusCode::kDeadlineExceeded),
                                         Call(1, 2, 0, ok, false)};
  ControlRunInfo info;
  info.command_line = "praxis-load --robots=2 --seed=7";
  info.seed = 7;
  info.robots = 2;
  info.robot_layouts = {"16,4,4,2,1", "8,2,2,1,1"};
  info.measure_from = kT0 + kPeriod;
  info.end = kT0 + 4 * kPeriod;  // every call's deadline is in [measure_from, end)
  return BuildControlReport(calls, info);
}

TEST(ControlReportTest, GoodputAndFatesPerRobotAndInAll) {
  const ControlLoopReport r = Report();
  EXPECT_EQ(r.calls, 6);
  EXPECT_EQ(r.on_time, 3);
  EXPECT_EQ(r.late, 1);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.skipped, 1);
  EXPECT_DOUBLE_EQ(r.goodput, 0.5);
  ASSERT_EQ(r.robots.size(), 2u);
  EXPECT_EQ(r.robots[0].layout, "16,4,4,2,1");
  EXPECT_EQ(r.robots[0].on_time, 2);
  EXPECT_EQ(r.robots[0].late, 1);
  EXPECT_EQ(r.robots[1].failed, 1);
  EXPECT_EQ(r.robots[1].skipped, 1);
}

TEST(ControlReportTest, StarvationIsTheLateTimeAndTheMissedWindows) {
  const ControlLoopReport r = Report();
  EXPECT_EQ(r.robots[0].starvation, Ms(400));
  EXPECT_EQ(r.robots[1].starvation, 2 * kPeriod);
  EXPECT_EQ(r.starvation, Ms(400) + 2 * kPeriod);
  const double window_s = absl::ToDoubleSeconds(3 * kPeriod);
  EXPECT_DOUBLE_EQ(r.robots[0].starvation_fraction, 0.4 / window_s);
  EXPECT_DOUBLE_EQ(r.starvation_fraction, (0.4 + 3.2) / (2 * window_s));
  EXPECT_EQ(r.robot_starvation.count, 2);
  EXPECT_DOUBLE_EQ(r.robot_starvation.max, 3.2);
}

TEST(ControlReportTest, LatenciesOfArrivedCallsAndOkMessages) {
  const ControlLoopReport r = Report();
  EXPECT_EQ(r.call_latency.count, 4) << "failed and skipped calls have no latency";
  EXPECT_DOUBLE_EQ(r.call_latency.max, 2000);
  EXPECT_EQ(r.messages, 5);
  EXPECT_EQ(r.message_errors, 1);
  EXPECT_EQ(r.message_codes.at("DEADLINE_EXCEEDED"), 1);
  EXPECT_EQ(r.message_latency.count, 4);
  EXPECT_EQ(r.forwards, 8) << "4 OK messages of 2 rows each";
  EXPECT_DOUBLE_EQ(r.server_queue.avg, 1);
  EXPECT_DOUBLE_EQ(r.server_compute.avg, 8);
  // Service time 10 + 20 + 2000 + 30 ms; queue and compute 9 ms of each.
  EXPECT_DOUBLE_EQ(r.queue_share, 4.0 / 2060);
  EXPECT_DOUBLE_EQ(r.compute_share, 32.0 / 2060);
  EXPECT_DOUBLE_EQ(r.queue_share + r.compute_share + r.other_share, 1);
  EXPECT_DOUBLE_EQ(r.batch_rows.avg, 2);
}

TEST(ControlReportTest, JsonHasEveryMetricInAiperfFormAndTheRunInfo) {
  const nlohmann::json j = nlohmann::json::parse(Report().Json());
  for (const char* metric : {"control_call_latency", "message_latency", "message_send_delay",
                             "message_service_time", "server_queue_time", "server_compute_time",
                             "message_other_time", "server_batch_rows", "robot_starvation_time"}) {
    ASSERT_TRUE(j.contains(metric)) << metric;
    for (const char* field : {"unit", "count", "avg", "min", "max", "std", "p1", "p5", "p10", "p25",
                              "p50", "p75", "p90", "p95", "p99", "p99.9"}) {
      EXPECT_TRUE(j[metric].contains(field)) << metric << "." << field;
    }
  }
  EXPECT_EQ(j["goodput"]["unit"], "ratio");
  EXPECT_DOUBLE_EQ(j["goodput"]["avg"].get<double>(), 0.5);
  EXPECT_EQ(j["control_call_count"]["avg"].get<double>(), 6);
  EXPECT_EQ(j["robots"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["robots"][1]["starvation_s"].get<double>(), 3.2);
  EXPECT_EQ(j["input_config"]["cli_command"], "praxis-load --robots=2 --seed=7");
  EXPECT_EQ(j["input_config"]["random_seed"], 7);
  EXPECT_DOUBLE_EQ(j["input_config"]["buffer_period_s"].get<double>(), 1.6);
  EXPECT_EQ(j["error_summary"],
            nlohmann::json::parse(R"([{"code": "DEADLINE_EXCEEDED", "count": 1}])"));
  EXPECT_FALSE(j.contains("max_robots_search"));
}

TEST(ControlReportTest, EmptyDistributionsAreNullAndTheSearchIsReported) {
  ControlRunInfo info;
  info.robots = 1;
  ControlLoopReport r = BuildControlReport({}, info);
  r.search =
      RobotSearchResult{.options = {.start = 1, .cap = 8},
                        .max_robots = 4,
                        .probes = {{.robots = 4, .goodput = 1}, {.robots = 8, .goodput = 0.9}}};
  const nlohmann::json j = nlohmann::json::parse(r.Json());
  EXPECT_EQ(j["message_latency"]["count"], 0);
  EXPECT_TRUE(j["message_latency"]["p50"].is_null());
  EXPECT_EQ(j["max_robots_search"]["max_robots"], 4);
  EXPECT_EQ(j["max_robots_search"]["cap"], 8);
  EXPECT_EQ(j["max_robots_search"]["probes"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["goodput"]["avg"].get<double>(), 0) << "no calls: goodput 0, not NaN";
  const std::string text = r.Text();
  EXPECT_NE(text.find("largest fleet 4; the figures above are its probe's"), std::string::npos)
      << text;
  EXPECT_NE(text.find("   8 robots: goodput  90.00 %"), std::string::npos) << text;
}

}  // namespace
}  // namespace praxis::client
