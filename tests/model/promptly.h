#pragma once

// RunPromptly: a hostile FIFO must be refused at once, and a test of that must fail, not hang,
// when it is not. (Header-only, shared by the model tests.)

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace praxis::model {

// Runs `load` on a thread and returns its status; fails the test when it has not returned within
// 10 s. Then it opens `fifo` for writing and closes it, which releases a reader blocked on the FIFO
// in open() or read(), so the thread can still be joined.
inline absl::Status RunPromptly(const std::function<absl::Status()>& load,
                                const std::string& fifo) {
  absl::Status status;
  absl::Notification done;
  std::thread t([&] {
    status = load();
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
    ADD_FAILURE() << "still blocked on " << fifo << " after 10 s";
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
  }
  t.join();
  return status;
}

}  // namespace praxis::model
