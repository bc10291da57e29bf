#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "praxis/v1/praxis.pb.h"
#include "server/step_request.h"
#include "server/step_task.h"

namespace praxis::serve {

// The messages of one step's answer, made one at a time for a write chain with one write in
// flight: the header, then each requested output as chunks of at most max_chunk_bytes tagged with
// name and offset, then the trailer. Only requested outputs are serialised; each is converted to
// its wire bytes once, and a chunk is copied out only when it is written. Not thread-safe.
class StepResponder {
 public:
  // InvalidArgument for max_chunk_bytes < 1; Internal if an output cannot be encoded.
  static absl::StatusOr<StepResponder> Create(const StepResult& result, const OutputPlan& plan,
                                              const std::string& request_id, absl::Time accepted,
                                              int64_t max_chunk_bytes);

  // Fills `msg` with the next message; false once the trailer has been produced.
  bool Next(v1::StepResponse* msg);

 private:
  struct Output {
    std::string name;
    std::string bytes;
  };
  enum class Stage { kHeader, kChunks, kTrailer, kDone };

  StepResponder() = default;

  v1::StepHeader header_;
  std::vector<Output> outputs_;
  int64_t max_chunk_bytes_ = 0;
  absl::Time accepted_;
  absl::Duration queue_time_, compute_time_;
  Stage stage_ = Stage::kHeader;
  size_t output_ = 0;   // the output being chunked
  int64_t offset_ = 0;  // into it
};

}  // namespace praxis::serve
