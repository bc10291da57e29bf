// praxis-load's control-loop mode without a server: the buffer model's judgement of each call,
// a robot's schedule on a synthetic clock (coordinated omission, skipping), the recorder's window,
// and the search for the largest fleet.

#include "client/control_loop.h"

#include <gtest/gtest.h>

#include <vector>

#include "client/robot_search.h"

namespace praxis::client {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);
const absl::Duration kPeriod = absl::Milliseconds(1600);  // 24 actions at 15 Hz

TEST(ControlLoopOptionsTest, BufferPeriodIsChunkOverRate) {
  EXPECT_EQ(ControlLoopOptions{}.BufferPeriod(), kPeriod);
  EXPECT_EQ((ControlLoopOptions{.hz = 50, .chunk_actions = 10}.BufferPeriod()),
            absl::Milliseconds(200));
}

TEST(ControlLoopOptionsTest, ValidateNamesTheFlag) {
  EXPECT_TRUE(ControlLoopOptions{}.Validate().ok());
  const std::pair<ControlLoopOptions, const char*> bad[] = {
      {{.hz = 0}, "--hz"},
      {{.hz = -1}, "--hz"},
      {{.chunk_actions = 0}, "--chunk_actions"},
      {{.steps = 0}, "--steps"},
      {{.passes = 0}, "--passes"},
      {{.hz = 1e6, .chunk_actions = 1}, "buffer period"}};
  for (const auto& [options, flag] : bad) {
    const absl::Status s = options.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(s.message().find(flag), absl::string_view::npos) << s;
  }
}

TEST(RobotScheduleTest, DeadlineIsTheNextDueTimeAndTheWindowOnePeriodAfter) {
  const RobotSchedule s(kT0, kPeriod);
  EXPECT_EQ(s.Due(0), kT0);
  EXPECT_EQ(s.Due(3), kT0 + 3 * kPeriod);
  EXPECT_EQ(s.Deadline(3), kT0 + 4 * kPeriod);
  EXPECT_EQ(s.WindowEnd(3), kT0 + 5 * kPeriod);
}

CallRecord Call(absl::Duration due_after, absl::Duration latency,
                absl::StatusCode code = absl::StatusCode::kOk, bool sent = true) {
  CallRecord c;
  c.due = kT0 + due_after;
  c.deadline = c.due + kPeriod;
  c.sent = sent;
  c.done = c.due + latency;
  c.code = code;
  return c;
}

TEST(JudgeCallTest, OnTimeUpToTheDeadlineWithoutStarvation) {
  const absl::Time end = kT0 + absl::Seconds(100);
  for (absl::Duration latency : {absl::Milliseconds(30), kPeriod}) {
    const CallOutcome o = JudgeCall(Call(absl::ZeroDuration(), latency), kPeriod, end);
    EXPECT_EQ(o.fate, CallFate::kOnTime) << latency;
    EXPECT_EQ(o.starvation, absl::ZeroDuration());
  }
}

TEST(JudgeCallTest, LateStarvesFromTheDeadlineToTheArrivalAtMostOneWindow) {
  const absl::Time end = kT0 + absl::Seconds(100);
  CallOutcome o =
      JudgeCall(Call(absl::ZeroDuration(), kPeriod + absl::Milliseconds(300)), kPeriod, end);
  EXPECT_EQ(o.fate, CallFate::kLate);
  EXPECT_EQ(o.starvation, absl::Milliseconds(300));
  o = JudgeCall(Call(absl::ZeroDuration(), 5 * kPeriod), kPeriod, end);
  EXPECT_EQ(o.fate, CallFate::kLate);
  EXPECT_EQ(o.starvation, kPeriod) << "a chunk later than its window starves the window only";
}

TEST(JudgeCallTest, FailedAndSkippedCallsStarveTheWholeWindow) {
  const absl::Time end = kT0 + absl::Seconds(100);
  CallOutcome o = JudgeCall(
      Call(absl::ZeroDuration(), absl::Milliseconds(10), absl::StatusCode::kResourceExhausted),
      kPeriod, end);
  EXPECT_EQ(o.fate, CallFate::kFailed) << "fast but failed is not on time";
  EXPECT_EQ(o.starvation, kPeriod);
  o = JudgeCall(Call(absl::ZeroDuration(), absl::ZeroDuration(), absl::StatusCode::kOk, false),
                kPeriod, end);
  EXPECT_EQ(o.fate, CallFate::kSkipped);
  EXPECT_EQ(o.starvation, kPeriod);
}

TEST(JudgeCallTest, StarvationStopsAtTheEndOfTheRun) {
  const CallRecord c = Call(absl::ZeroDuration(), 3 * kPeriod, absl::StatusCode::kUnavailable);
  const CallOutcome o = JudgeCall(c, kPeriod, c.deadline + absl::Milliseconds(200));
  EXPECT_EQ(o.fate, CallFate::kFailed);
  EXPECT_EQ(o.starvation, absl::Milliseconds(200));
}

TEST(ControlRecorderTest, KeepsTheCallsWhoseDeadlineIsInTheWindow) {
  ControlRecorder rec(kT0 + kPeriod, kT0 + 4 * kPeriod);
  for (int k = 0; k < 5; ++k) {
    CallRecord c = Call(k * kPeriod, absl::Milliseconds(10));
    c.index = k;
    rec.Add(c);  // deadlines at 1, 2, 3, 4 and 5 periods
  }
  const std::vector<CallRecord> kept = rec.Calls();
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].index, 0) << "a deadline at measure_from is measured";
  EXPECT_EQ(kept[2].index, 2) << "a deadline at the end is not";
}

// A clock that moves only when slept on or advanced.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time t) : now_(t) {}
  absl::Time Now() override { return now_; }
  void SleepUntil(absl::Time t) override { now_ = std::max(now_, t); }
  void Advance(absl::Duration d) { now_ += d; }

 private:
  absl::Time now_;
};

// A control call of one message that takes `latencies[i]` for the i-th call sent.
ControlCall FakeCall(FakeClock& clock, std::vector<absl::Duration> latencies) {
  return [&clock, latencies, i = size_t{0}](CallRecord& c) mutable {
    MessageRecord m{.intended = c.due, .sent = clock.Now()};
    clock.Advance(latencies.at(i++));
    m.done = clock.Now();
    c.messages.push_back(m);
    c.done = m.done;
  };
}

TEST(RunRobotTest, FastCallsAreSentWhenDueAndAllOnTime) {
  FakeClock clock(kT0);
  ControlRecorder rec(kT0, kT0 + 5 * kPeriod);
  RunRobot(3, RobotSchedule(kT0, kPeriod), clock,
           FakeCall(clock, std::vector<absl::Duration>(5, absl::Milliseconds(40))), rec);
  const std::vector<CallRecord> calls = rec.Calls();
  ASSERT_EQ(calls.size(), 4u) << "5 calls due before the end; the 5th's deadline is past it";
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(calls[k].robot, 3);
    EXPECT_EQ(calls[k].messages.at(0).sent, kT0 + k * kPeriod) << k;
    EXPECT_EQ(JudgeCall(calls[k], kPeriod, rec.end()).fate, CallFate::kOnTime) << k;
  }
}

// Every call takes 1.5 periods: the robot falls half a period further behind with each call,
// each is timed from its due time, and call 4, whose window has passed when the robot is free
// (at 6 periods), is skipped. Call 6 (sent at 7.5) starves until the end of the run (8).
TEST(RunRobotTest, ABehindRobotTimesFromTheDueTimeAndSkipsStaleCalls) {
  FakeClock clock(kT0);
  ControlRecorder rec(kT0, kT0 + 8 * kPeriod);
  RunRobot(0, RobotSchedule(kT0, kPeriod), clock,
           FakeCall(clock, std::vector<absl::Duration>(8, kPeriod * 1.5)), rec);
  const std::vector<CallRecord> calls = rec.Calls();
  ASSERT_EQ(calls.size(), 7u);
  const double sent_at[] = {0, 1.5, 3, 4.5, -1, 6, 7.5};  // periods after kT0; -1: skipped
  const absl::Duration starvation[] = {kPeriod / 2, kPeriod, kPeriod, kPeriod,
                                       kPeriod,     kPeriod, kPeriod};
  for (int k = 0; k < 7; ++k) {
    const CallOutcome o = JudgeCall(calls[k], kPeriod, rec.end());
    EXPECT_EQ(o.starvation, starvation[k]) << k;
    if (sent_at[k] < 0) {
      EXPECT_FALSE(calls[k].sent);
      EXPECT_EQ(o.fate, CallFate::kSkipped);
      continue;
    }
    EXPECT_EQ(o.fate, CallFate::kLate) << k;
    const MessageRecord& m = calls[k].messages.at(0);
    EXPECT_EQ(m.sent, kT0 + kPeriod * sent_at[k]) << k;
    EXPECT_EQ(m.intended, kT0 + k * kPeriod) << "timed from its due time, not its send";
  }
}

TEST(RunRobotTest, CallsDueWhenTheRunHasEndedAreSkipped) {
  FakeClock clock(kT0);
  ControlRecorder rec(kT0, kT0 + 3 * kPeriod);
  // The first call takes 10 periods: the run is over when it returns.
  std::vector<absl::Duration> latencies = {10 * kPeriod};
  RunRobot(0, RobotSchedule(kT0, kPeriod), clock, FakeCall(clock, latencies), rec);
  const std::vector<CallRecord> calls = rec.Calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_TRUE(calls[0].sent);
  EXPECT_FALSE(calls[1].sent);
  EXPECT_EQ(clock.Now(), kT0 + 10 * kPeriod) << "nothing was sent after the first call";
}

absl::StatusOr<RobotProbe> Capacity(int robots, int capacity) {
  return RobotProbe{.goodput = robots <= capacity ? 1.0 : 0.5};
}

std::vector<int> Probed(const RobotSearchResult& r) {
  std::vector<int> n;
  for (const RobotProbe& p : r.probes) n.push_back(p.robots);
  return n;
}

TEST(FindMaxRobotsTest, DoublesThenBisectsToTheCapacity) {
  const absl::StatusOr<RobotSearchResult> r =
      FindMaxRobots([](int n) { return Capacity(n, 37); }, {.start = 1, .cap = 256});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_robots, 37);
  EXPECT_FALSE(r->capped);
  EXPECT_EQ(Probed(*r), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37}));
}

TEST(FindMaxRobotsTest, StopsAtTheCap) {
  const absl::StatusOr<RobotSearchResult> r =
      FindMaxRobots([](int n) { return Capacity(n, 1000); }, {.start = 3, .cap = 20});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_robots, 20);
  EXPECT_TRUE(r->capped);
  EXPECT_EQ(Probed(*r), (std::vector<int>{3, 6, 12, 20}));
}

TEST(FindMaxRobotsTest, ZeroWhenNoFleetKeepsTheTarget) {
  const absl::StatusOr<RobotSearchResult> r =
      FindMaxRobots([](int n) { return Capacity(n, 0); }, {.start = 4, .cap = 256});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->max_robots, 0);
  EXPECT_EQ(Probed(*r), (std::vector<int>{4, 2, 1}));
}

TEST(FindMaxRobotsTest, ProbesAreBoundedForEveryCapacity) {
  for (int capacity = 0; capacity <= 300; ++capacity) {
    const absl::StatusOr<RobotSearchResult> r =
        FindMaxRobots([&](int n) { return Capacity(n, capacity); }, {.start = 1, .cap = 256});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->max_robots, std::min(capacity, 256)) << capacity;
    EXPECT_LE(r->probes.size(), 18u) << capacity;  // 2 log2(256) + 2
  }
}

TEST(FindMaxRobotsTest, AProbeErrorEndsTheSearch) {
  const absl::StatusOr<RobotSearchResult> r = FindMaxRobots(
      [](int n) -> absl::StatusOr<RobotProbe> {
        if (n == 8) return absl::UnavailableError("server gone");
        return Capacity(n, 100);
      },
      {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

TEST(FindMaxRobotsTest, ValidateNamesTheFlag) {
  const std::pair<RobotSearchOptions, const char*> bad[] = {
      {{.start = 0}, "--robots"},
      {{.start = 8, .cap = 4}, "--max_robots"},
      {{.target = 0}, "--goodput_target"},
      {{.target = 1.5}, "--goodput_target"}};
  for (const auto& [options, flag] : bad) {
    const absl::Status s = options.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(s.message().find(flag), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace praxis::client
