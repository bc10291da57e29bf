#include "client/load_stats.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

namespace praxis::client {
namespace {

TEST(SummarizeTest, NearestRankPercentilesOfOneToAThousand) {
  std::vector<double> ms;
  for (int i = 1000; i >= 1; --i) ms.push_back(i);  // unsorted on purpose
  const LatencySummary s = Summarize(ms);
  EXPECT_EQ(s.count, 1000);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 1000);
  EXPECT_DOUBLE_EQ(s.mean, 500.5);
  EXPECT_DOUBLE_EQ(s.p50, 500);
  EXPECT_DOUBLE_EQ(s.p90, 900);
  EXPECT_DOUBLE_EQ(s.p99, 990);
  EXPECT_DOUBLE_EQ(s.p999, 999);
}

TEST(SummarizeTest, FiveSamples) {
  const LatencySummary s = Summarize({5, 1, 4, 2, 3});
  EXPECT_EQ(s.count, 5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.p50, 3);
  EXPECT_DOUBLE_EQ(s.p90, 5);
  EXPECT_DOUBLE_EQ(s.p99, 5);
  EXPECT_DOUBLE_EQ(s.p999, 5);
  EXPECT_DOUBLE_EQ(s.max, 5);
}

TEST(SummarizeTest, SingleSampleIsEveryStatistic) {
  const LatencySummary s = Summarize({7.25});
  EXPECT_EQ(s.count, 1);
  for (double v : {s.min, s.mean, s.p50, s.p90, s.p99, s.p999, s.max}) EXPECT_DOUBLE_EQ(v, 7.25);
}

TEST(SummarizeTest, NoSamplesIsAllZero) {
  const LatencySummary s = Summarize({});
  EXPECT_EQ(s.count, 0);
  for (double v : {s.min, s.mean, s.p50, s.p90, s.p99, s.p999, s.max}) EXPECT_EQ(v, 0);
}

const absl::Time kT0 = absl::FromUnixSeconds(1000);

Sample MakeSample(absl::Duration start_after, absl::Duration latency, absl::StatusCode code,
                  int64_t queue_us, int64_t compute_us, std::string layout) {
  Sample s;
  s.start = kT0 + start_after;
  s.latency = latency;
  s.code = code;
  s.queue_us = queue_us;
  s.compute_us = compute_us;
  s.layout = std::move(layout);
  return s;
}

// One warm-up sample, three OK and two failed measured samples over two layouts.
std::unique_ptr<Recorder> FilledRecorder() {
  auto rec = std::make_unique<Recorder>(kT0);
  {
    const auto ms = [](int64_t n) { return absl::Milliseconds(n); };
    rec->Add(MakeSample(-absl::Seconds(1), ms(1), absl::StatusCode::kOk, 9000, 9000, "warm"));
    rec->Add(MakeSample(ms(0), ms(10), absl::StatusCode::kOk, 1000, 4000, "K1"));
    rec->Add(MakeSample(ms(500), ms(20), absl::StatusCode::kOk, 2000, 5000, "K1"));
    rec->Add(MakeSample(ms(1000), ms(30), absl::StatusCode::kOk, 3000, 6000, "K2"));
    rec->Add(MakeSample(ms(1500), ms(2), absl::StatusCode::kResourceExhausted, 0, 0, "K2"));
    rec->Add(MakeSample(ms(1750), ms(100), absl::StatusCode::kDeadlineExceeded, 0, 0, "K1"));
  }
  return rec;
}

TEST(RecorderTest, ReportCountsByCodeAndLayoutAddUp) {
  const LoadReport r = FilledRecorder()->Report(kT0 + absl::Seconds(2));
  EXPECT_DOUBLE_EQ(r.elapsed_s, 2);
  EXPECT_EQ(r.sent, 5) << "the warm-up sample is excluded";
  EXPECT_EQ(r.ok, 3);
  EXPECT_EQ(r.errors, 2);
  EXPECT_DOUBLE_EQ(r.throughput, 1.5);
  EXPECT_EQ(r.codes, (std::map<std::string, int64_t>{
                         {"OK", 3}, {"RESOURCE_EXHAUSTED", 1}, {"DEADLINE_EXCEEDED", 1}}));
  EXPECT_EQ(r.by_layout, (std::map<std::string, int64_t>{{"K1", 3}, {"K2", 2}}));
  int64_t codes = 0, layouts = 0;
  for (const auto& [k, n] : r.codes) codes += n;
  for (const auto& [k, n] : r.by_layout) layouts += n;
  EXPECT_EQ(codes, r.sent);
  EXPECT_EQ(layouts, r.sent);
  EXPECT_EQ(r.samples.size(), 5u);
}

TEST(RecorderTest, ReportSummarizesOnlyOkRequests) {
  const LoadReport r = FilledRecorder()->Report(kT0 + absl::Seconds(2));
  EXPECT_EQ(r.latency.count, 3);
  EXPECT_DOUBLE_EQ(r.latency.min, 10);
  EXPECT_DOUBLE_EQ(r.latency.mean, 20);
  EXPECT_DOUBLE_EQ(r.latency.p50, 20);
  EXPECT_DOUBLE_EQ(r.latency.p99, 30);
  EXPECT_DOUBLE_EQ(r.latency.max, 30) << "the 100 ms failure is not an OK latency";
  EXPECT_EQ(r.server_queue.count, 3);
  EXPECT_DOUBLE_EQ(r.server_queue.min, 1);
  EXPECT_DOUBLE_EQ(r.server_queue.mean, 2);
  EXPECT_DOUBLE_EQ(r.server_queue.max, 3);
  EXPECT_DOUBLE_EQ(r.server_compute.min, 4);
  EXPECT_DOUBLE_EQ(r.server_compute.mean, 5);
  EXPECT_DOUBLE_EQ(r.server_compute.max, 6);
}

TEST(RecorderTest, SnapshotCountsMeasuredSamples) {
  const Recorder::Progress p = FilledRecorder()->Snapshot();
  EXPECT_EQ(p.done, 5);
  EXPECT_EQ(p.errors, 2);
  EXPECT_DOUBLE_EQ(p.p50_ms, 20);
  EXPECT_DOUBLE_EQ(p.p99_ms, 30);
}

TEST(RecorderTest, HistogramBucketsAreLogSpacedFromFastestToSlowest) {
  Recorder rec(kT0);
  for (int v : {1, 2, 3, 50, 1000}) {
    rec.Add(
        MakeSample(absl::ZeroDuration(), absl::Milliseconds(v), absl::StatusCode::kOk, 0, 0, "K1"));
  }
  rec.Add(MakeSample(absl::ZeroDuration(), absl::Milliseconds(5000), absl::StatusCode::kUnavailable,
                     0, 0, "K1"));
  const std::string bar20(20, '#'), bar40(40, '#');
  const std::string want = "  <=      1.778 ms        1 |" + bar20 + "\n" +
                           "  <=      3.162 ms        2 |" + bar40 + "\n" +
                           "  <=      5.623 ms        0 |\n"
                           "  <=     10.000 ms        0 |\n"
                           "  <=     17.783 ms        0 |\n"
                           "  <=     31.623 ms        0 |\n"
                           "  <=     56.234 ms        1 |" +
                           bar20 + "\n" +
                           "  <=    100.000 ms        0 |\n"
                           "  <=    177.828 ms        0 |\n"
                           "  <=    316.228 ms        0 |\n"
                           "  <=    562.341 ms        0 |\n"
                           "  <=   1000.000 ms        1 |" +
                           bar20 + "\n";
  EXPECT_EQ(rec.Report(kT0 + absl::Seconds(1)).histogram, want);
}

TEST(RecorderTest, HistogramOfOneSampleAndOfNone) {
  Recorder one(kT0);
  one.Add(MakeSample(absl::ZeroDuration(), absl::Milliseconds(5), absl::StatusCode::kOk, 0, 0, ""));
  const std::string h = one.Report(kT0 + absl::Seconds(1)).histogram;
  const std::vector<std::string> lines = absl::StrSplit(h, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 12u) << h;
  EXPECT_EQ(lines[0], "  <=      5.000 ms        1 |" + std::string(40, '#'));
  for (size_t i = 1; i < lines.size(); ++i) EXPECT_NE(lines[i].find(" 0 |"), std::string::npos);

  Recorder none(kT0);
  none.Add(MakeSample(absl::ZeroDuration(), absl::Milliseconds(5), absl::StatusCode::kInternal, 0,
                      0, ""));
  EXPECT_EQ(none.Report(kT0 + absl::Seconds(1)).histogram, "  (no successful requests)\n");
}

TEST(LoadReportTest, JsonCarriesEveryFigure) {
  const LoadReport r = FilledRecorder()->Report(kT0 + absl::Seconds(2));
  const nlohmann::json j = nlohmann::json::parse(r.Json());
  EXPECT_DOUBLE_EQ(j.at("elapsed_s").get<double>(), 2);
  EXPECT_EQ(j.at("sent").get<int64_t>(), 5);
  EXPECT_EQ(j.at("ok").get<int64_t>(), 3);
  EXPECT_EQ(j.at("errors").get<int64_t>(), 2);
  EXPECT_DOUBLE_EQ(j.at("throughput_rps").get<double>(), 1.5);
  const nlohmann::json& lat = j.at("latency_ms");
  EXPECT_EQ(lat.at("count").get<int64_t>(), 3);
  EXPECT_DOUBLE_EQ(lat.at("min").get<double>(), 10);
  EXPECT_DOUBLE_EQ(lat.at("mean").get<double>(), 20);
  EXPECT_DOUBLE_EQ(lat.at("p50").get<double>(), 20);
  EXPECT_DOUBLE_EQ(lat.at("p90").get<double>(), 30);
  EXPECT_DOUBLE_EQ(lat.at("p99").get<double>(), 30);
  EXPECT_DOUBLE_EQ(lat.at("p99.9").get<double>(), 30);
  EXPECT_DOUBLE_EQ(lat.at("max").get<double>(), 30);
  EXPECT_DOUBLE_EQ(j.at("server_queue_ms").at("mean").get<double>(), 2);
  EXPECT_DOUBLE_EQ(j.at("server_compute_ms").at("max").get<double>(), 6);
  EXPECT_EQ(j.at("codes"),
            nlohmann::json::parse(R"({"OK": 3, "RESOURCE_EXHAUSTED": 1, "DEADLINE_EXCEEDED": 1})"));
  EXPECT_EQ(j.at("layouts"), nlohmann::json::parse(R"({"K1": 3, "K2": 2})"));
  EXPECT_EQ(j.size(), 10u);
}

TEST(LoadReportTest, CsvHasOneRowPerMeasuredSample) {
  const LoadReport r = FilledRecorder()->Report(kT0 + absl::Seconds(2));
  EXPECT_EQ(r.Csv(),
            "start_s,latency_ms,code,server_queue_ms,server_compute_ms,layout\n"
            "0.000000,10.000,OK,1.000,4.000,K1\n"
            "0.500000,20.000,OK,2.000,5.000,K1\n"
            "1.000000,30.000,OK,3.000,6.000,K2\n"
            "1.500000,2.000,RESOURCE_EXHAUSTED,0.000,0.000,K2\n"
            "1.750000,100.000,DEADLINE_EXCEEDED,0.000,0.000,K1\n");
}

TEST(LoadReportTest, TextListsCodesAndLayouts) {
  const std::string t = FilledRecorder()->Report(kT0 + absl::Seconds(2)).Text();
  for (const char* line : {
           "  measured 2.00 s: 5 requests, 3 OK, 2 errors, 1.50 OK/s\n",
           "  end-to-end      min 10.000  mean 20.000  p50 20.000  p90 30.000  p99 30.000  "
           "p99.9 30.000  max 30.000 ms\n",
           "Status codes\n  DEADLINE_EXCEEDED    1\n  OK                   3\n"
           "  RESOURCE_EXHAUSTED   1\n",
           "Layouts\n  K1                   3\n  K2                   2\n",
       }) {
    EXPECT_NE(t.find(line), std::string::npos) << "missing: " << line << "\nin:\n" << t;
  }
}

}  // namespace
}  // namespace praxis::client
