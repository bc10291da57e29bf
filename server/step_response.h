#pragma once

#include <torch/types.h>

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
// name and offset, then the trailer — or, where the plan asks for a whole answer and its tensor
// bytes fit in max_chunk_bytes, all of them in one StepAnswer message. Only requested outputs are
// kept (the rest of the result is released at Create; each output once sent); each chunk is
// converted to the wire dtype and copied from the tensor's memory into its message in one pass,
// only when it is written. Not thread-safe.
class StepResponder {
 public:
  // InvalidArgument for max_chunk_bytes < 8 (one element of any dtype); Internal if an output
  // cannot be encoded. Never throws. `text_kept`: the header's (a Session keeps the step's text).
  static absl::StatusOr<StepResponder> Create(const StepResult& result, const OutputPlan& plan,
                                              const std::string& request_id, absl::Time accepted,
                                              int64_t max_chunk_bytes, bool text_kept = false);

  // Fills `msg` with the next message: true, or false once the trailer has been produced; Internal
  // if a chunk cannot be converted. Never throws.
  absl::StatusOr<bool> Next(v1::StepResponse* msg);

  // Whether the message Next last filled was the answer's last (its trailer, or the whole answer).
  bool finished() const { return stage_ == Stage::kDone; }

  // The tensor bytes of the whole answer (what the header announces).
  int64_t tensor_bytes() const { return tensor_bytes_; }

 private:
  struct Output {
    std::string name;
    torch::Tensor
        flat;  // contiguous, 1-D, on the host, in the model's compute dtype; may view a batch
    torch::ScalarType wire;
  };
  enum class Stage { kHeader, kChunks, kTrailer, kDone };

  StepResponder() = default;
  // Throws (LibTorch) on failure; Create catches.
  void SetHeader(const StepResult& r, const OutputPlan& plan, const std::string& request_id);
  // Moves past the outputs already sent (releasing each); false once none is left.
  bool NextOutput();
  // The next chunk of outputs_[output_]: whole elements, at most max_chunk_bytes_. Throws.
  void NextChunk(v1::TensorChunk* chunk);
  // The trailer, timed now; the answer is then done.
  void FillTrailer(v1::StepTrailer* t);
  // The whole answer in one message: header, every chunk, trailer. Throws.
  void FillWhole(v1::StepAnswer* answer);

  v1::StepHeader header_;
  std::vector<Output> outputs_;
  int64_t max_chunk_bytes_ = 0;
  int64_t tensor_bytes_ = 0;
  bool whole_ = false;  // one StepAnswer message
  absl::Time accepted_;
  absl::Duration queue_time_, compute_time_;
  Stage stage_ = Stage::kHeader;
  size_t output_ = 0;    // the output being chunked
  int64_t element_ = 0;  // its next element
};

}  // namespace praxis::serve
