#pragma once

// praxis-load's control-loop mode: the robot's action-buffer model, each robot's schedule of
// control calls, and the judgement of each call (on time, late, failed, skipped) with the time the
// robot spent with an empty action buffer. Nothing here talks to a server or reads a clock of its
// own: robot_fleet.cc drives it with gRPC and the real clock, the unit tests with synthetic times.
//
// The model (client/README.md, "Control-loop mode"):
//   A robot executes one action every 1/hz s. A control call returns a chunk of chunk_actions
//   actions, so one chunk lasts the buffer period T = chunk_actions / hz. Chunks are double
//   buffered: call k is due at due_k = first_due + k*T, the moment the robot starts executing the
//   previous chunk, and its chunk is executed over its window [due_k + T, due_k + 2T). So call k
//   must complete by its deadline due_k + T, when the buffer would run dry.
//   A chunk that arrives after its deadline is late: the robot starved (had no action) from the
//   deadline until the arrival, and the actions of the ticks already past are stale and dropped.
//   A failed call starves the robot for its whole window. A robot has one call in flight; when it
//   falls behind, a call is sent late but timed from due_k (no coordinated omission), and a call
//   whose whole window has passed before it could be sent is skipped (its chunk would be all
//   stale). Starvation is clipped to the end of the run.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace praxis::client {

// What one robot's control loop asks of the server, and how fast it consumes actions.
struct ControlLoopOptions {
  double hz = 15;          // actions executed per second
  int chunk_actions = 24;  // actions returned by one control call
  int steps = 2;           // Euler steps per control call, sent one after the other
  int passes = 2;          // forwards per step (guided + unguided), sent together

  // chunk_actions / hz: how long one chunk lasts, the time budget of a control call.
  absl::Duration BufferPeriod() const;
  // InvalidArgument naming the flag (--hz, --chunk_actions, --steps, --passes) that is out of
  // range.
  absl::Status Validate() const;
};

// When one robot's control calls are due. Immutable; thread-safe.
class RobotSchedule {
 public:
  RobotSchedule(absl::Time first_due, absl::Duration period)
      : first_due_(first_due), period_(period) {}

  absl::Time Due(int64_t k) const { return first_due_ + k * period_; }
  // When call k's chunk must have arrived: the buffer runs dry then.
  absl::Time Deadline(int64_t k) const { return Due(k + 1); }
  // The end of call k's window: after it, nothing of call k's chunk is worth executing.
  absl::Time WindowEnd(int64_t k) const { return Due(k + 2); }
  absl::Duration period() const { return period_; }

 private:
  absl::Time first_due_;
  absl::Duration period_;
};

// One forward request of a control call (a step's passes batched, or one pass).
struct MessageRecord {
  int step = 0;
  int pass = -1;          // -1: every pass in one request (rows = passes)
  absl::Time intended{};  // when it was meant to go: the call's due time for step 0, else the
                          // arrival of the step before it (steps depend on each other)
  absl::Time sent{};      // when the client sent it
  absl::Time done{};      // its last byte, or its error
  absl::StatusCode code = absl::StatusCode::kOk;
  int64_t queue_us = 0;  // server-reported (OK only)
  int64_t compute_us = 0;
  int64_t batch_rows = 0;  // rows of the server batch it ran in
};

// One control call of one robot.
struct CallRecord {
  int robot = 0;
  int64_t index = 0;  // k in the robot's schedule
  absl::Time due{}, deadline{};
  bool sent = false;  // false: skipped, its window had passed or the run had ended first
  absl::Time done{};  // the last message's end (sent calls)
  absl::StatusCode code = absl::StatusCode::kOk;  // the first failed message's code
  std::vector<MessageRecord> messages;
};

enum class CallFate { kOnTime, kLate, kFailed, kSkipped };
// "on_time", "late", "failed", "skipped".
const char* CallFateName(CallFate fate);

struct CallOutcome {
  CallFate fate = CallFate::kOnTime;
  absl::Duration starvation{};  // time without actions over the call's window, up to `end`
};

// The fate of `call` with buffer period `period`, for a run that ends at `end`. Starvation is
// [deadline, min(arrival, deadline + period, end)), empty when on time; a failed or skipped call
// never arrives. So a call whose deadline is before `end` starved iff it was not on time.
CallOutcome JudgeCall(const CallRecord& call, absl::Duration period, absl::Time end);

// Time as a robot loop sees it: the real clock, or a test's synthetic one.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() = 0;
  // Returns at `t` or at once when `t` has passed.
  virtual void SleepUntil(absl::Time t) = 0;
};

// absl::Now and absl::SleepFor. Thread-safe.
class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepUntil(absl::Time t) override { absl::SleepFor(t - absl::Now()); }
};

// Thread-safe sink of finished calls; keeps those whose deadline is in [measure_from, end), the
// measured ones, and drops the others (warm-up, and the calls due in the last period, which keep
// the load steady until the end but whose deadline is past it).
class ControlRecorder {
 public:
  ControlRecorder(absl::Time measure_from, absl::Time end)
      : measure_from_(measure_from), end_(end) {}
  void Add(CallRecord call);
  // The measured calls, in the order they were added.
  std::vector<CallRecord> Calls() const;
  // Measured calls so far, and those not on time (for the progress line); `period` as JudgeCall.
  struct Progress {
    int64_t calls = 0, missed = 0;
  };
  Progress Snapshot(absl::Duration period) const;

  absl::Time measure_from() const { return measure_from_; }
  absl::Time end() const { return end_; }

 private:
  const absl::Time measure_from_, end_;
  mutable absl::Mutex mu_;
  std::vector<CallRecord> measured_ ABSL_GUARDED_BY(mu_);
};

// Performs one control call: sends its messages and fills `call`'s done, code and messages.
// Called on the robot's thread only.
using ControlCall = std::function<void(CallRecord& call)>;

// One robot's loop: every call of `schedule` due before recorder.end(), in order.
// Each is sent at its due time (or at once when the robot is behind), or skipped when, at the time
// it could be sent, its window has passed or the run has ended; each goes to `recorder`.
// Blocks the calling thread for the whole run; `clock` and `call` are used from it alone.
void RunRobot(int robot, const RobotSchedule& schedule, Clock& clock, const ControlCall& call,
              ControlRecorder& recorder);

}  // namespace praxis::client
