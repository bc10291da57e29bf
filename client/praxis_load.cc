// praxis-load: the load generator for praxis-server.
//   closed loop: --concurrency=N callers, each with one request in flight;
//   open loop:   --rate=R requests/s, --arrival=poisson|constant, at most --max_in_flight at once
//                (a request that waits for a free slot counts its latency from when it was due).
// The run lasts --warmup (not measured) plus --duration, or ends after --requests measured
// requests, whichever comes first. A weighted --mix of layouts (and decode on/off) is drawn per
// request. A progress line goes to stderr; the report to stdout, --json and --csv.
//   control loop: --robots=N robots, each running a robot's control loop (client/control_mode.h,
//                the model in client/control_loop.h), or --find_max_robots.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <deque>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/client_flags.h"
#include "client/control_mode.h"
#include "client/load_mix.h"
#include "client/load_stats.h"
#include "client/praxis_client.h"
#include "client/request_builder.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/usage.h"
#include "wire/selection.h"

ABSL_FLAG(int, connections, 1,
          "gRPC connections, callers spread round-robin (more where Sessions need them: 32 each)");
ABSL_FLAG(int, concurrency, 8, "closed loop: concurrent callers");
ABSL_FLAG(double, rate, 0, "open loop: requests per second (0 runs the closed loop)");
ABSL_FLAG(std::string, arrival, "poisson", "open loop: poisson | constant");
ABSL_FLAG(int, max_in_flight, 64, "open loop: most requests outstanding at once");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10), "measured time, after the warm-up");
ABSL_FLAG(int64_t, requests, 0, "measured requests; 0 leaves only --duration");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "run before measuring, excluded from figures");
ABSL_FLAG(std::string, mix, "16,4,4,2,1",
          "weighted mix: ENTRY;ENTRY;... with ENTRY = text_len,h,w,K,F[,enc][*WEIGHT] "
          "(enc: decode off)");
ABSL_FLAG(std::string, transport, "",
          "session (each caller's or robot's steps on one Session stream; with "
          "--pass_mode=separate, one per pass) | unary (a Step call per step, each within "
          "--timeout); empty: unary in the closed and open loops, session in the control loop");
ABSL_FLAG(int64_t, batch, 1, "rows per request");
ABSL_FLAG(std::string, outputs, "velocity", "comma-separated outputs to ask for");
ABSL_FLAG(std::string, wire_dtype, "float32", "float32 | bfloat16 | float16 outputs");
ABSL_FLAG(absl::Duration, progress_interval, absl::Seconds(1), "between progress lines");
ABSL_FLAG(std::string, json, "", "write the report as JSON here");
ABSL_FLAG(std::string, csv, "", "write one CSV row per measured request here");

namespace praxis::client {
namespace {

// The mix of --mix, --batch, --outputs, --wire_dtype and --whole_answer for a model's `dims`,
// requests of `rows` rows.
absl::StatusOr<std::vector<MixEntry>> MixFromFlags(const wire::StepDims& dims, int64_t rows) {
  RequestOptions options;
  options.outputs = absl::StrSplit(absl::GetFlag(FLAGS_outputs), ',', absl::SkipEmpty());
  PRAXIS_ASSIGN_OR_RETURN(options.wire_dtype,
                          wire::ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype)));
  options.whole_answer = absl::GetFlag(FLAGS_whole_answer);
  return ParseMix(absl::GetFlag(FLAGS_mix), dims, rows, options);
}

// Everything the request loops share.
class LoadRun {
 public:
  LoadRun(std::vector<std::unique_ptr<Client>> clients, std::vector<MixEntry> mix,
          Transport transport)
      : clients_(std::move(clients)),
        mix_(std::move(mix)),
        transport_(transport),
        start_(absl::Now()),
        measure_from_(start_ + absl::GetFlag(FLAGS_warmup)),
        end_(measure_from_ + absl::GetFlag(FLAGS_duration)),
        limit_(absl::GetFlag(FLAGS_requests)),
        recorder_(measure_from_) {
    std::vector<double> weights;
    for (const MixEntry& e : mix_) weights.push_back(e.weight);
    pick_ = std::discrete_distribution<size_t>(weights.begin(), weights.end());
  }

  // True while a request due at `t` may still be sent; counts the measured ones.
  bool Admit(absl::Time t) {
    if (t >= end_) return false;
    if (t < measure_from_ || limit_ == 0) return true;
    return issued_.fetch_add(1) < limit_;
  }

  // Caller `i`'s transport, on connection i mod the connections; its calls and stream end one
  // --timeout after the run at the latest.
  StepCaller Caller(int i) const {
    StepCaller caller(*clients_[i % clients_.size()], transport_, absl::GetFlag(FLAGS_timeout));
    caller.set_hard_end(end_ + absl::GetFlag(FLAGS_timeout));
    return caller;
  }

  // Sends one request of the mix, due at `due`, through `caller`, and records it.
  void Send(absl::Time due, std::mt19937_64& rng, StepCaller& caller) {
    const MixEntry& e = mix_[Pick(rng)];
    const absl::StatusOr<StepReply> r = caller.Step(e.request);
    Sample s{due, absl::Now() - due, r.status().code(), 0, 0, e.name};
    if (r.ok()) {
      s.queue_us = r->header.queue_us();
      s.compute_us = r->header.compute_us();
    }
    recorder_.Add(std::move(s));
  }

  void ClosedLoop(int callers) {
    std::vector<std::thread> threads;
    for (int i = 0; i < callers; ++i) {
      threads.emplace_back([this, i] {
        std::mt19937_64 rng(i);
        StepCaller caller = Caller(i);
        for (absl::Time t = absl::Now(); Admit(t); t = absl::Now()) Send(t, rng, caller);
        caller.Close();
      });
    }
    for (std::thread& t : threads) t.join();
  }

  void OpenLoop(double rate, bool poisson, int max_in_flight) {
    std::vector<std::thread> workers;
    for (int i = 0; i < max_in_flight; ++i) {
      workers.emplace_back([this, i] {
        std::mt19937_64 rng(i);
        StepCaller caller = Caller(i);
        while (true) {
          absl::Time due;
          {
            absl::MutexLock lock(&mu_);
            mu_.Await(absl::Condition(this, &LoadRun::HasWorkOrDone));
            if (due_.empty()) break;
            due = due_.front();
            due_.pop_front();
          }
          Send(due, rng, caller);
        }
        caller.Close();
      });
    }
    std::mt19937_64 rng(12345);
    std::exponential_distribution<double> gap(rate);
    for (absl::Time t = start_; Admit(t);) {
      absl::SleepFor(t - absl::Now());
      {
        absl::MutexLock lock(&mu_);
        due_.push_back(t);
      }
      t += absl::Seconds(poisson ? gap(rng) : 1.0 / rate);
    }
    {
      absl::MutexLock lock(&mu_);
      scheduling_done_ = true;
    }
    for (std::thread& w : workers) w.join();
  }

  const Recorder& recorder() const { return recorder_; }
  absl::Time start() const { return start_; }
  absl::Time measure_from() const { return measure_from_; }

 private:
  size_t Pick(std::mt19937_64& rng) {
    absl::MutexLock lock(&pick_mu_);
    return pick_(rng);
  }
  bool HasWorkOrDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !due_.empty() || scheduling_done_;
  }

  const std::vector<std::unique_ptr<Client>> clients_;
  const std::vector<MixEntry> mix_;
  const Transport transport_;
  const absl::Time start_, measure_from_, end_;
  const int64_t limit_;
  Recorder recorder_;
  std::atomic<int64_t> issued_{0};
  absl::Mutex pick_mu_;
  std::discrete_distribution<size_t> pick_ ABSL_GUARDED_BY(pick_mu_);
  absl::Mutex mu_;
  std::deque<absl::Time> due_ ABSL_GUARDED_BY(mu_);
  bool scheduling_done_ ABSL_GUARDED_BY(mu_) = false;
};

// Prints the progress line every interval until `done`.
void Progress(const LoadRun& run, const std::atomic<bool>& done) {
  const bool tty = isatty(STDERR_FILENO);
  const absl::Duration every = absl::GetFlag(FLAGS_progress_interval);
  absl::Time last_time = run.measure_from();
  int64_t last_done = 0;
  while (!done) {
    for (absl::Time wake = absl::Now() + every; !done && absl::Now() < wake;) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    const absl::Time now = absl::Now();
    const Recorder::Progress p = run.recorder().Snapshot();
    const double dt = absl::ToDoubleSeconds(now - std::max(last_time, run.measure_from()));
    const double rate = dt > 0 ? (p.done - last_done) / dt : 0;
    const bool warming = now < run.measure_from();
    std::fprintf(stderr,
                 "%s[%6.1fs]%s done %lld | %.1f req/s | p50 %.3f ms | p99 %.3f ms | "
                 "errors %lld%s",
                 tty ? "\r" : "", absl::ToDoubleSeconds(now - run.start()),
                 warming ? " warm-up" : "", static_cast<long long>(p.done), rate, p.p50_ms,
                 p.p99_ms, static_cast<long long>(p.errors), tty ? "   " : "\n");
    last_time = now;
    last_done = p.done;
  }
  if (tty) std::fprintf(stderr, "\n");
}

// argv as one shell-quoted line, for the report's run info.
std::string CommandLine(int argc, char** argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool plain =
        !arg.empty() &&
        arg.find_first_not_of(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_=.,:/+@%") ==
            std::string::npos;
    if (i > 0) out += ' ';
    out += plain ? arg : "'" + absl::StrReplaceAll(arg, {{"'", "'\\''"}}) + "'";
  }
  return out;
}

// The input feature sizes of the served model, from GetModelInfo.
absl::StatusOr<wire::StepDims> ServedDims(const Client& client) {
  PRAXIS_ASSIGN_OR_RETURN(const v1::ModelInfo info, client.Info(absl::Seconds(30)));
  return StepDimsOf(info);
}

absl::Status RunControl(const std::string& command_line) {
  if (absl::GetFlag(FLAGS_rate) > 0 || absl::GetFlag(FLAGS_requests) > 0 ||
      !absl::GetFlag(FLAGS_csv).empty() || absl::GetFlag(FLAGS_batch) != 1) {
    return absl::InvalidArgumentError(
        "--robots / --find_max_robots: expected no --rate, --requests, --csv or --batch (the "
        "control-loop mode runs each robot's schedule for --duration, sends --passes rows or "
        "one-row requests, and reports in --json)");
  }
  FleetOptions o;
  o.address = absl::GetFlag(FLAGS_address);
  o.client = ClientOptionsFromFlags();
  o.min_connections = absl::GetFlag(FLAGS_connections);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.duration = absl::GetFlag(FLAGS_duration);
  o.call_timeout = absl::GetFlag(FLAGS_timeout);
  o.progress_interval = absl::GetFlag(FLAGS_progress_interval);
  o.info.command_line = command_line;
  o.info.mix = absl::GetFlag(FLAGS_mix);
  PRAXIS_ASSIGN_OR_RETURN(const std::unique_ptr<Client> client,
                          Client::Create(o.address, o.client));
  PRAXIS_ASSIGN_OR_RETURN(const wire::StepDims dims, ServedDims(*client));
  return RunControlMode(
      std::move(o), [&dims](int64_t rows) { return MixFromFlags(dims, rows); },
      absl::GetFlag(FLAGS_json));
}

// The load-test flags' ranges; InvalidArgument naming the flag.
absl::Status CheckLoadFlags() {
  const std::string arrival = absl::GetFlag(FLAGS_arrival);
  if (absl::GetFlag(FLAGS_connections) < 1) {
    return absl::InvalidArgumentError("--connections: expected >= 1");
  }
  if (absl::GetFlag(FLAGS_concurrency) < 1) {
    return absl::InvalidArgumentError("--concurrency: expected >= 1");
  }
  if (absl::GetFlag(FLAGS_rate) < 0) return absl::InvalidArgumentError("--rate: expected >= 0");
  if (arrival != "poisson" && arrival != "constant") {
    return absl::InvalidArgumentError("--arrival: expected poisson or constant");
  }
  if (absl::GetFlag(FLAGS_max_in_flight) < 1) {
    return absl::InvalidArgumentError("--max_in_flight: expected >= 1");
  }
  if (absl::GetFlag(FLAGS_duration) <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--duration: expected > 0 (it bounds every run)");
  }
  return absl::OkStatus();
}

// Writes the report's text to stdout, and its JSON and CSV where --json and --csv say.
absl::Status WriteReport(const LoadReport& report) {
  std::cout << report.Text();
  if (!absl::GetFlag(FLAGS_json).empty()) {
    PRAXIS_RETURN_IF_ERROR(WriteStringToFile(absl::GetFlag(FLAGS_json), report.Json()));
  }
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    PRAXIS_RETURN_IF_ERROR(WriteStringToFile(absl::GetFlag(FLAGS_csv), report.Csv()));
  }
  return absl::OkStatus();
}

absl::Status Run(const std::string& command_line) {
  if (ControlModeRequested()) return RunControl(command_line);
  PRAXIS_RETURN_IF_ERROR(CheckLoadFlags());
  const int connections = absl::GetFlag(FLAGS_connections);
  const double rate = absl::GetFlag(FLAGS_rate);
  const std::string arrival = absl::GetFlag(FLAGS_arrival);
  PRAXIS_ASSIGN_OR_RETURN(const Transport transport,
                          ParseTransport(absl::GetFlag(FLAGS_transport), Transport::kUnary));
  const int callers =
      rate > 0 ? absl::GetFlag(FLAGS_max_in_flight) : absl::GetFlag(FLAGS_concurrency);
  PRAXIS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Client>> clients,
                          LoadClients(absl::GetFlag(FLAGS_address), ClientOptionsFromFlags(),
                                      connections, transport == Transport::kSession ? callers : 0));
  PRAXIS_ASSIGN_OR_RETURN(const wire::StepDims dims, ServedDims(*clients[0]));
  PRAXIS_ASSIGN_OR_RETURN(std::vector<MixEntry> mix,
                          MixFromFlags(dims, absl::GetFlag(FLAGS_batch)));
  std::cerr << absl::StrFormat(
      "praxis-load: %s, %s over %s, %d connection(s), mix of %d, warm-up %s, duration %s%s\n",
      absl::GetFlag(FLAGS_address),
      rate > 0 ? absl::StrFormat("open loop %.1f req/s (%s)", rate, arrival)
               : absl::StrFormat("closed loop x%d", absl::GetFlag(FLAGS_concurrency)),
      TransportName(transport), clients.size(), mix.size(),
      absl::FormatDuration(absl::GetFlag(FLAGS_warmup)),
      absl::FormatDuration(absl::GetFlag(FLAGS_duration)),
      absl::GetFlag(FLAGS_requests) > 0
          ? absl::StrCat(", at most ", absl::GetFlag(FLAGS_requests), " requests")
          : "");
  LoadRun run(std::move(clients), std::move(mix), transport);
  std::atomic<bool> done{false};
  std::thread progress([&] { Progress(run, done); });
  if (rate > 0) {
    run.OpenLoop(rate, arrival == "poisson", absl::GetFlag(FLAGS_max_in_flight));
  } else {
    run.ClosedLoop(absl::GetFlag(FLAGS_concurrency));
  }
  const absl::Time end = absl::Now();
  done = true;
  progress.join();
  return WriteReport(run.recorder().Report(end));
}

}  // namespace
}  // namespace praxis::client

int main(int argc, char** argv) {
  praxis::SetUsage(
      "praxis-load --address=HOST:PORT [--concurrency=N | --rate=R | --robots=N "
      "[--find_max_robots]] [--duration=10s] ...");
  const std::string command_line = praxis::client::CommandLine(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = praxis::client::Run(command_line);
  if (!s.ok()) {
    std::cerr << "praxis-load: " << s << std::endl;
    return 2;
  }
  return 0;
}
