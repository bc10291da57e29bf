#pragma once

// Program usage for our command-line tools. Abseil's --help lists only the flags of a file named
// after the program (praxis-server has main.cc, praxis-cli praxis_cli.cc), so by default it listed
// none: SetUsage makes --help list every flag defined outside Abseil itself.

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace praxis {

// Call first in main(), before absl::ParseCommandLine.
inline void SetUsage(absl::string_view message) {
  absl::SetProgramUsageMessage(message);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helppackage_flags = config.contains_help_flags;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace praxis
