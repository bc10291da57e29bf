#include "client/control_loop.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace praxis::client {

absl::Duration ControlLoopOptions::BufferPeriod() const {
  return absl::Seconds(chunk_actions / hz);
}

absl::Status ControlLoopOptions::Validate() const {
  if (!(hz > 0) || !std::isfinite(hz)) {
    return absl::InvalidArgumentError(absl::StrCat("--hz: expected a rate > 0, got ", hz));
  }
  if (chunk_actions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk_actions: expected >= 1 action per chunk, got ", chunk_actions));
  }
  if (steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps: expected >= 1 Euler step per control call, got ", steps));
  }
  if (passes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--passes: expected >= 1 forward per step, got ", passes));
  }
  if (BufferPeriod() < absl::Microseconds(100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chunk_actions / --hz: expected a buffer period of at least 100us, got ",
                     absl::FormatDuration(BufferPeriod())));
  }
  return absl::OkStatus();
}

const char* CallFateName(CallFate fate) {
  switch (fate) {
    case CallFate::kOnTime:
      return "on_time";
    case CallFate::kLate:
      return "late";
    case CallFate::kFailed:
      return "failed";
    case CallFate::kSkipped:
      return "skipped";
  }
  return "?";
}

CallOutcome JudgeCall(const CallRecord& call, absl::Duration period, absl::Time end) {
  CallOutcome out;
  absl::Time arrival = absl::InfiniteFuture();
  if (!call.sent) {
    out.fate = CallFate::kSkipped;
  } else if (call.code != absl::StatusCode::kOk) {
    out.fate = CallFate::kFailed;
  } else {
    arrival = call.done;
    out.fate = call.done <= call.deadline ? CallFate::kOnTime : CallFate::kLate;
  }
  const absl::Time starved_until = std::min({arrival, call.deadline + period, end});
  out.starvation = std::max(absl::ZeroDuration(), starved_until - call.deadline);
  return out;
}

void ControlRecorder::Add(CallRecord call) {
  absl::MutexLock lock(&mu_);
  if (call.deadline >= measure_from_ && call.deadline < end_) measured_.push_back(std::move(call));
}

std::vector<CallRecord> ControlRecorder::Calls() const {
  absl::MutexLock lock(&mu_);
  return measured_;
}

ControlRecorder::Progress ControlRecorder::Snapshot(absl::Duration period) const {
  absl::MutexLock lock(&mu_);
  Progress p;
  p.calls = static_cast<int64_t>(measured_.size());
  for (const CallRecord& c : measured_) {
    if (JudgeCall(c, period, end_).fate != CallFate::kOnTime) ++p.missed;
  }
  return p;
}

void RunRobot(int robot, const RobotSchedule& schedule, Clock& clock, const ControlCall& call,
              ControlRecorder& recorder) {
  for (int64_t k = 0; schedule.Due(k) < recorder.end(); ++k) {
    CallRecord c;
    c.robot = robot;
    c.index = k;
    c.due = schedule.Due(k);
    c.deadline = schedule.Deadline(k);
    const absl::Time now = clock.Now();
    if (now < schedule.WindowEnd(k) && now < recorder.end()) {
      clock.SleepUntil(c.due);
      call(c);
      c.sent = true;
    }
    recorder.Add(std::move(c));
  }
}

}  // namespace praxis::client
