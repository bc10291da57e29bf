#include "client/robot_search.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace praxis::client {

absl::Status RobotSearchOptions::Validate() const {
  if (start < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--robots: expected >= 1 robot to start the search from, got ", start));
  }
  if (cap < start) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_robots: expected >= --robots (", start, "), got ", cap));
  }
  if (!(target > 0 && target <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--goodput_target: expected a fraction in (0, 1], got ", target));
  }
  return absl::OkStatus();
}

absl::StatusOr<RobotSearchResult> FindMaxRobots(
    const std::function<absl::StatusOr<RobotProbe>(int robots)>& probe,
    const RobotSearchOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  RobotSearchResult result;
  result.options = options;
  int good = 0;               // largest fleet known to keep the target
  int bad = options.cap + 1;  // smallest fleet known to miss it
  int n = options.start;
  // Each probe doubles `good` (while nothing failed, up to the cap) or halves bad - good, so the
  // loop ends after at most log2(cap / start) + 1 + log2(cap) + 1 probes.
  while (true) {
    absl::StatusOr<RobotProbe> p = probe(n);
    if (!p.ok()) return p.status();
    p->robots = n;
    result.probes.push_back(*p);
    (p->goodput >= options.target ? good : bad) = n;
    if (bad - good <= 1) break;
    if (bad == options.cap + 1) {
      n = std::min(2 * good, options.cap);  // good < cap here, else bad - good == 1
    } else {
      n = good + (bad - good) / 2;
    }
  }
  result.max_robots = good;
  result.capped = good == options.cap;
  return result;
}

}  // namespace praxis::client
