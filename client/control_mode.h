#pragma once

// The command-line side of praxis-load's control-loop mode: its flags (--robots, --hz, --steps,
// --passes, --chunk_actions, --pass_mode, --transport, --seed, --find_max_robots, --max_robots,
// --goodput_target), one run or the search for the largest fleet, and the reports.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/load_mix.h"
#include "client/robot_fleet.h"

namespace praxis::client {

// True when --robots or --find_max_robots asks for the control-loop mode.
bool ControlModeRequested();

// Makes --mix's requests with `rows` rows.
using MixMaker = std::function<absl::StatusOr<std::vector<MixEntry>>(int64_t rows)>;

// Runs the mode. `base` holds what praxis-load's shared flags set (address, client options,
// connections, warm-up, duration, timeout, progress interval, info.command_line and info.mix);
// the mode's flags set the rest. Prints the text report to stdout, writes the JSON report to
// `json_path` when it is not empty. InvalidArgument naming a flag out of range; connection
// errors. Call from main's thread, once.
absl::Status RunControlMode(FleetOptions base, const MixMaker& mix, const std::string& json_path);

}  // namespace praxis::client
