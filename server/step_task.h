#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "model/backbone.h"
#include "server/batching/task.h"
#include "server/step_request.h"

namespace praxis::serve {

// What one caller gets back: its own rows of its batch's outputs, and where the time went.
struct StepResult {
  model::BackboneOutput output;
  std::string layout_key;
  absl::Duration queue_time;    // accepted → its batch started
  absl::Duration compute_time;  // its batch's model run
  int64_t batch_rows = 0;       // rows of the batch it ran in
};

// A validated step in the batcher: the decoded request, its layout key and budget, and the
// callback that delivers its one final answer (a result from the batch runner, or a status from
// Fail). The callback runs on a batcher worker thread and must not block.
//
// `cancelled` is shared with the call, which sets it when the client goes away; it may be set from
// any thread.
class StepTask : public batching::Task {
 public:
  using Done = std::function<void(absl::StatusOr<StepResult>)>;

  StepTask(DecodedStep step, absl::Time deadline,
           std::shared_ptr<const std::atomic<bool>> cancelled, Done done);
  ~StepTask() override;

  const std::string& layout_key() const override { return layout_key_; }
  int64_t rows() const override { return step_.inputs.noised.size(0); }
  int64_t bytes() const override { return bytes_; }
  double cost() const override { return step_.cost.gflop(); }
  absl::Time deadline() const override { return deadline_; }
  bool cancelled() const override { return cancelled_->load(std::memory_order_relaxed); }
  void Fail(absl::Status status) override { Complete(std::move(status)); }

  const model::StepInputs& inputs() const { return step_.inputs; }
  const OutputPlan& plan() const { return step_.outputs; }
  absl::Time accepted() const { return accepted_; }
  // Delivers the final answer; called exactly once (by the runner or through Fail).
  void Complete(absl::StatusOr<StepResult> result);

 private:
  DecodedStep step_;
  std::string layout_key_;
  int64_t bytes_ = 0;
  absl::Time deadline_;
  absl::Time accepted_;
  std::shared_ptr<const std::atomic<bool>> cancelled_;
  Done done_;
};

}  // namespace praxis::serve
