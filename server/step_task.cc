#include "server/step_task.h"

#include <utility>

#include "common/check.h"
#include "wire/layout_key.h"

namespace praxis::serve {

StepTask::StepTask(DecodedStep step, absl::Time deadline,
                   std::shared_ptr<const std::atomic<bool>> cancelled, Done done)
    : step_(std::move(step)),
      layout_key_(wire::LayoutKey(step_.inputs)),
      deadline_(deadline),
      accepted_(absl::Now()),
      cancelled_(std::move(cancelled)),
      done_(std::move(done)) {
  const model::StepInputs& in = step_.inputs;
  for (const wire::InputField& field : wire::kInputFields) {
    if ((in.*field.tensor).defined()) bytes_ += (in.*field.tensor).nbytes();
  }
}

// Every accepted task is answered exactly once.
StepTask::~StepTask() { PRAXIS_CHECK(!done_, "StepTask destroyed without an answer"); }

void StepTask::Complete(absl::StatusOr<StepResult> result) {
  PRAXIS_CHECK(done_, "StepTask answered twice");
  Done done = std::move(done_);
  done_ = nullptr;
  done(std::move(result));
}

}  // namespace praxis::serve
