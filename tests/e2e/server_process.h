#pragma once

// praxis-server as a child process, for the end-to-end tests: started from PRAXIS_SERVER_BIN on
// 127.0.0.1 with ports picked by the kernel, which it reports in its --port_file (JSON), its stdout
// read line by line, its resident memory read from /proc, and its exit awaited with a deadline.

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/praxis_client.h"
#include "common/file_util.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace praxis::serve::fixtures {

// A praxis-server child process with its stdout on a pipe. Not thread-safe. The destructor kills
// the process if it is still running.
class ServerProcess {
 public:
  // Starts PRAXIS_SERVER_BIN with `flags` after the loopback address and port 0; pid() <= 0 if
  // the variable is unset or the spawn failed.
  explicit ServerProcess(std::vector<std::string> flags) {
    const char* bin = std::getenv("PRAXIS_SERVER_BIN");
    if (bin == nullptr) return;
    char dir[] = "/tmp/praxis-port-XXXXXX";
    if (mkdtemp(dir) == nullptr) return;
    port_dir_ = dir;
    port_file_ = JoinPath(port_dir_, "port.json");
    std::vector<std::string> args = {bin, "--host=127.0.0.1", "--port=0", "--metrics_port=0",
                                     "--port_file=" + port_file_};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    if (pipe(fds) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    if (posix_spawn(&pid_, bin, &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    out_fd_ = fds[0];
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (!port_dir_.empty()) {
      unlink(port_file_.c_str());
      unlink((port_file_ + ".tmp").c_str());
      rmdir(port_dir_.c_str());
    }
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Waits for the port file (written once the server is SERVING) and takes the ports from it, then
  // the human start-up line (printed before the file) from stdout. False, with the reason appended
  // to log(), if the process ended, or wrote no valid file within `timeout`.
  bool WaitServing(absl::Duration timeout = absl::Seconds(120)) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string line;
    while (!PathExists(port_file_)) {
      if (absl::Now() >= deadline) {
        return Fail(absl::StrCat("no ", port_file_, " within ", absl::FormatDuration(timeout)));
      }
      // Reading stdout keeps its pipe from filling; its end means the process ended.
      if (!ReadLine(&line, absl::Now() + absl::Milliseconds(20))) {
        if (out_fd_ < 0) return Fail("the server exited before serving");
      } else if (absl::StrContains(line, "serving on ")) {
        start_line_ = line;
      }
    }
    const absl::StatusOr<std::string> text = ReadFileToString(port_file_);
    const nlohmann::json j =
        nlohmann::json::parse(text.ok() ? *text : "", nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("port") || !j["port"].is_number_integer()) {
      return Fail(absl::StrCat("bad port file ", port_file_, ": ", text.ok() ? *text : ""));
    }
    port_ = j["port"].get<int>();
    if (j.contains("metrics_port") && j["metrics_port"].is_number_integer()) {
      metrics_port_ = j["metrics_port"].get<int>();
    }
    while (start_line_.empty() && ReadLine(&line, absl::Now() + absl::Seconds(5))) {
      if (absl::StrContains(line, "serving on ")) {
        start_line_ = line;
        break;
      }
    }
    return port_ > 0;
  }

  // The next line of stdout (kept in log()); false at its end or when `deadline` passes first.
  bool ReadLine(std::string* line, absl::Time deadline = absl::InfiniteFuture()) {
    for (;;) {
      if (const size_t eol = pending_.find('\n'); eol != std::string::npos) {
        *line = pending_.substr(0, eol + 1);
        pending_.erase(0, eol + 1);
        log_ += *line;
        return true;
      }
      if (out_fd_ < 0) return false;
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      pollfd p{out_fd_, POLLIN, 0};
      const int wait_ms = left == absl::InfiniteDuration()
                              ? -1
                              : static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
      if (poll(&p, 1, wait_ms) <= 0) continue;  // timed out (checked above) or interrupted
      char buf[4096];
      const ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) {  // end of stdout: whatever is left is the last line
        close(out_fd_);
        out_fd_ = -1;
        if (pending_.empty()) return false;
        pending_ += '\n';
        continue;
      }
      pending_.append(buf, n);
    }
  }

  // Reads stdout to its end, then reaps the process; its exit status (128 + signal if killed).
  int WaitExit() {
    for (std::string line; ReadLine(&line);) {
    }
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Waits at most `timeout` for the process to end, polling every few milliseconds; its exit
  // status (as WaitExit), or -1 if it was still running (it is then killed).
  int WaitExitWithin(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    int status = 0;
    for (;;) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) break;
      if (r < 0 || absl::Now() >= deadline) return -1;
      absl::SleepFor(absl::Milliseconds(2));
    }
    exited_ = true;
    for (std::string line; ReadLine(&line, absl::Now() + absl::Seconds(5));) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // VmRSS from /proc/PID/status in bytes; -1 if it cannot be read.
  int64_t RssBytes() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    for (std::string line; std::getline(in, line);) {
      if (!absl::StartsWith(line, "VmRSS:")) continue;
      int64_t kib = 0;
      std::vector<std::string> w = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      if (w.size() >= 2 && absl::SimpleAtoi(w[1], &kib)) return kib * 1024;
    }
    return -1;
  }

  pid_t pid() const { return pid_; }
  const std::string& port_file() const { return port_file_; }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  const std::string& start_line() const { return start_line_; }
  const std::string& log() const { return log_; }

 private:
  bool Fail(const std::string& why) {
    absl::StrAppend(&log_, "[ServerProcess] ", why, "\n");
    return false;
  }

  pid_t pid_ = -1;
  std::string port_dir_, port_file_;  // a fresh directory for --port_file
  int out_fd_ = -1;
  std::string pending_;  // read from stdout, not yet a whole line
  bool exited_ = false;
  int port_ = 0;
  int metrics_port_ = 0;
  std::string start_line_, log_;
};

// A client of the server on 127.0.0.1:port that does not retry.
inline std::unique_ptr<client::Client> Connect(int port) {
  client::ClientOptions o;
  o.max_attempts = 1;
  return client::Client::Create(absl::StrCat("127.0.0.1:", port), o).value();
}

}  // namespace praxis::serve::fixtures
