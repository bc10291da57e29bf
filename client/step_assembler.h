#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "praxis/v1/praxis.pb.h"

namespace praxis::client {

// One step's answer, reassembled: the header, every tensor it announced (CPU, in its wire dtype),
// and the trailer.
struct StepReply {
  v1::StepHeader header;
  std::map<std::string, torch::Tensor> tensors;
  v1::StepTrailer trailer;
};

// Rebuilds a StepReply from the StepResponse messages of one step, checking the protocol: a header
// first (each tensor's dtype known and its shape's byte size, overflow-checked, equal to nbytes),
// then for each announced tensor, in header order, chunks with contiguous offsets that add up to
// exactly its announced size, then a trailer — as separate messages, or all in one StepAnswer
// (StepRequest.whole_answer). Not thread-safe.
class StepAssembler {
 public:
  // Feeds the next message. True once the trailer has arrived; DataLoss naming the tensor for a
  // message out of order, a gap or overlap, a size other than announced, or a header whose shape
  // is negative, overflows or disagrees with its nbytes; the StepError's code
  // and message for a failed session step.
  absl::StatusOr<bool> Add(const v1::StepResponse& msg);
  // The reply, once Add returned true; the assembler is then reset.
  StepReply Take();

 private:
  absl::Status AddHeader(const v1::StepHeader& h);
  absl::StatusOr<bool> AddChunk(const v1::TensorChunk& c);
  absl::StatusOr<bool> AddTrailer(const v1::StepTrailer& t);
  // Decodes the bytes of the current tensor and moves to the next.
  absl::Status Finish();
  // Finishes tensors of zero bytes, which have no chunks.
  absl::Status SkipEmpty();

  bool have_header_ = false;
  bool complete_ = false;
  StepReply reply_;
  int current_ = 0;  // index into header.tensors of the tensor being filled
  std::string bytes_;
};

}  // namespace praxis::client
