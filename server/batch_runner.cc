#include "server/batch_runner.h"

#include <utility>

#include "model/step_batch.h"
#include "server/step_task.h"

namespace praxis::serve {

void RunStepBatch(model::StepRunner& model, ServerMetrics& metrics,
                  std::vector<std::unique_ptr<batching::Task>> batch) {
  std::vector<StepTask*> tasks;
  std::vector<const model::StepInputs*> inputs;
  int64_t rows = 0;
  for (const auto& t : batch) {
    tasks.push_back(static_cast<StepTask*>(t.get()));
    inputs.push_back(&tasks.back()->inputs());
    rows += t->rows();
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<model::BackboneOutput> out = [&]() -> absl::StatusOr<model::BackboneOutput> {
    try {
      return model.Run(model::StackSteps(inputs));
    } catch (const std::exception& e) {  // StackSteps is LibTorch
      return absl::InternalError(std::string("stacking the batch: ") + e.what());
    }
  }();
  const absl::Duration compute = absl::Now() - start;
  metrics.ObserveBatch(rows, compute);
  int64_t row = 0;
  for (StepTask* task : tasks) {
    const absl::Duration queued = start - task->accepted();
    metrics.ObserveQueue(queued);
    if (!out.ok()) {
      task->Complete(out.status());
      continue;
    }
    StepResult r{model::SliceRows(*out, row, task->rows()), task->layout_key(), queued, compute,
                 rows};
    row += task->rows();
    task->Complete(std::move(r));
  }
}

}  // namespace praxis::serve
