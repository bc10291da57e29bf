#include "client/robot_fleet.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "common/status_macros.h"

namespace praxis::client {
namespace {

// One robot's side of the wire: its Session per pass slot (or unary calls) and its requests.
// Used by the robot's thread only, but the separate passes of a step run on helper threads, one
// slot each, joined before the next step. Not thread-safe otherwise.
class RobotWorker {
 public:
  RobotWorker(const Client& client, const RobotLayout& layout, const FleetOptions& options)
      : layout_(layout),
        options_(options),
        slots_(options.pass_mode == PassMode::kBatched ? 1 : options.loop.passes) {
    callers_.reserve(slots_);
    for (int i = 0; i < slots_; ++i) {
      callers_.emplace_back(client, options.transport, options.call_timeout);
    }
  }

  // Streams and unary calls end at `hard_end`, one buffer period after the measured window: a
  // measured call still running then was late anyway, and is counted failed (DEADLINE_EXCEEDED).
  void set_hard_end(absl::Time t) {
    for (StepCaller& c : callers_) c.set_hard_end(t);
  }

  // One control call timed from call.due: `steps` steps, each step's passes together.
  void Call(CallRecord& call) {
    absl::Time intended = call.due;
    for (int step = 0; step < options_.loop.steps; ++step) {
      const size_t first = call.messages.size();
      SendStep(step, intended, call.messages);
      for (size_t i = first; i < call.messages.size(); ++i) {
        const MessageRecord& m = call.messages[i];
        intended = std::max(intended, m.done);
        if (call.code == absl::StatusCode::kOk) call.code = m.code;
      }
      if (call.code != absl::StatusCode::kOk) break;  // the next step needs this one's velocity
    }
    call.done = intended;
  }

  // Half-closes and drops the robot's streams; the next call opens new ones.
  void Close() {
    for (StepCaller& c : callers_) c.Close();
  }

 private:
  void SendStep(int step, absl::Time intended, std::vector<MessageRecord>& out) {
    if (options_.pass_mode == PassMode::kBatched) {
      out.push_back(Send(0, layout_.batched, step, -1, intended));
      return;
    }
    std::vector<MessageRecord> passes(slots_);
    std::vector<std::thread> helpers;
    for (int p = 1; p < slots_; ++p) {
      helpers.emplace_back([&, p] { passes[p] = Send(p, layout_.single, step, p, intended); });
    }
    passes[0] = Send(0, layout_.single, step, 0, intended);
    for (std::thread& t : helpers) t.join();
    out.insert(out.end(), passes.begin(), passes.end());
  }

  MessageRecord Send(int slot, const v1::StepRequest& request, int step, int pass,
                     absl::Time intended) {
    MessageRecord m{.step = step, .pass = pass, .intended = intended, .sent = absl::Now()};
    absl::StatusOr<StepReply> r = callers_[slot].Step(request);
    m.done = absl::Now();
    m.code = r.status().code();
    if (r.ok()) {
      m.queue_us = r->header.queue_us();
      m.compute_us = r->header.compute_us();
      m.batch_rows = r->header.batch_rows();
    }
    return m;
  }

  const RobotLayout& layout_;
  const FleetOptions& options_;
  const int slots_;
  std::vector<StepCaller> callers_;  // one per pass slot
};

// Each robot's layout index and schedule phase, drawn from the seed.
struct RobotDraw {
  size_t layout = 0;
  absl::Duration phase;
};

std::vector<RobotDraw> DrawRobots(int robots, const FleetOptions& o) {
  std::vector<double> weights;
  for (const RobotLayout& l : o.layouts) weights.push_back(l.weight);
  std::mt19937_64 rng(o.seed);
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  std::uniform_real_distribution<double> phase(0, 1);
  std::vector<RobotDraw> draws(robots);
  for (RobotDraw& d : draws) {
    d.layout = pick(rng);
    d.phase = phase(rng) * o.loop.BufferPeriod();
  }
  return draws;
}

absl::StatusOr<std::vector<std::unique_ptr<Client>>> Connect(int robots, const FleetOptions& o) {
  const int streams_per_robot = o.pass_mode == PassMode::kBatched ? 1 : o.loop.passes;
  return LoadClients(o.address, o.client, o.min_connections, robots * streams_per_robot);
}

// Prints the progress line every interval until `done`.
void Progress(const ControlRecorder& recorder, absl::Duration period, absl::Duration every,
              absl::Notification& done) {
  const absl::Time start = absl::Now();
  while (!done.WaitForNotificationWithTimeout(every)) {
    const ControlRecorder::Progress p = recorder.Snapshot(period);
    std::fprintf(stderr, "[%6.1fs]%s calls %lld | missed %lld | goodput %.2f %%\n",
                 absl::ToDoubleSeconds(absl::Now() - start),
                 absl::Now() < recorder.measure_from() ? " warm-up" : "",
                 static_cast<long long>(p.calls), static_cast<long long>(p.missed),
                 p.calls > 0 ? 100.0 * (p.calls - p.missed) / p.calls : 100.0);
  }
}

}  // namespace

absl::StatusOr<PassMode> ParsePassMode(const std::string& name) {
  if (name == "batched") return PassMode::kBatched;
  if (name == "separate") return PassMode::kSeparate;
  return absl::InvalidArgumentError(
      absl::StrCat("--pass_mode: expected batched or separate, got \"", name, "\""));
}

absl::Status FleetOptions::Validate() const {
  PRAXIS_RETURN_IF_ERROR(loop.Validate());
  if (duration < loop.BufferPeriod()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--duration: expected at least one buffer period (--chunk_actions / --hz = ",
        absl::FormatDuration(loop.BufferPeriod()),
        ") so that every robot has a measured call, got ", absl::FormatDuration(duration)));
  }
  if (warmup < absl::ZeroDuration()) return absl::InvalidArgumentError("--warmup: expected >= 0");
  if (min_connections < 1) return absl::InvalidArgumentError("--connections: expected >= 1");
  if (layouts.empty()) return absl::InvalidArgumentError("--mix: expected at least one entry");
  return absl::OkStatus();
}

namespace {

// One run of a fleet: the robots' workers and threads, and the schedule they share once every
// robot has made its first call. Run() once, from one thread.
class Fleet {
 public:
  Fleet(int robots, const FleetOptions& options) : robots_(robots), options_(options) {}

  absl::StatusOr<ControlLoopReport> Run() {
    PRAXIS_ASSIGN_OR_RETURN(clients_, Connect(robots_, options_));
    draws_ = DrawRobots(robots_, options_);
    for (int i = 0; i < robots_; ++i) {
      workers_.push_back(std::make_unique<RobotWorker>(
          *clients_[i % clients_.size()], options_.layouts[draws_[i].layout], options_));
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < robots_; ++i) threads.emplace_back([this, i] { Robot(i); });
    ready_.Wait();
    StartSchedule();
    absl::Notification done;
    std::thread progress;
    if (options_.progress_interval > absl::ZeroDuration()) {
      progress = std::thread([&] {
        Progress(*recorder_, options_.loop.BufferPeriod(), options_.progress_interval, done);
      });
    }
    for (std::thread& t : threads) t.join();
    done.Notify();
    if (progress.joinable()) progress.join();
    if (first_failures_ > 0) {
      std::fprintf(stderr, "praxis-load: %d robot(s) failed their first (untimed) call\n",
                   first_failures_.load());
    }
    ControlLoopReport report = BuildControlReport(recorder_->Calls(), Info());
    report.first_call_failures = first_failures_;
    return report;
  }

 private:
  // Fixes the schedule (its start is now) and lets the robots go.
  void StartSchedule() {
    start_ = absl::Now();
    const absl::Time measure_from = start_ + options_.warmup;
    recorder_ = std::make_unique<ControlRecorder>(measure_from, measure_from + options_.duration);
    go_.Notify();
  }

  void Robot(int i) {
    RobotWorker& worker = *workers_[i];
    worker.set_hard_end(absl::Now() + options_.call_timeout);
    CallRecord first;
    first.due = absl::Now();
    worker.Call(first);
    if (first.code != absl::StatusCode::kOk) ++first_failures_;
    worker.Close();
    ready_.DecrementCount();
    go_.WaitForNotification();
    worker.set_hard_end(recorder_->end() + options_.loop.BufferPeriod());
    RealClock clock;
    const RobotSchedule schedule(start_ + draws_[i].phase, options_.loop.BufferPeriod());
    RunRobot(
        i, schedule, clock, [&worker](CallRecord& c) { worker.Call(c); }, *recorder_);
    worker.Close();
  }

  ControlRunInfo Info() const {
    ControlRunInfo info = options_.info;
    info.address = options_.address;
    info.robots = robots_;
    info.loop = options_.loop;
    info.pass_mode = options_.pass_mode == PassMode::kBatched ? "batched" : "separate";
    info.transport = TransportName(options_.transport);
    info.connections = static_cast<int>(clients_.size());
    info.warmup = options_.warmup;
    info.seed = options_.seed;
    info.start = start_;
    info.measure_from = recorder_->measure_from();
    info.end = recorder_->end();
    for (const RobotDraw& d : draws_) info.robot_layouts.push_back(options_.layouts[d.layout].name);
    return info;
  }

  const int robots_;
  const FleetOptions& options_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<RobotDraw> draws_;
  std::vector<std::unique_ptr<RobotWorker>> workers_;
  absl::BlockingCounter ready_{robots_};
  absl::Notification go_;
  // Written before go_ is notified, read by the robots after.
  absl::Time start_;
  std::unique_ptr<ControlRecorder> recorder_;
  std::atomic<int> first_failures_{0};
};

}  // namespace

absl::StatusOr<ControlLoopReport> RunFleet(int robots, const FleetOptions& options) {
  PRAXIS_RETURN_IF_ERROR(options.Validate());
  if (robots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--robots: expected >= 1, got ", robots));
  }
  return Fleet(robots, options).Run();
}

}  // namespace praxis::client
