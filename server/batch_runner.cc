#include "server/batch_runner.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/answer_pipeline.h"
#include "server/step_batch.h"
#include "server/step_task.h"

namespace praxis::serve {

namespace {

// Runs the batch of `tasks` once, asking for the outputs any of them wants, and splits the
// result into each task's own rows and outputs (server/step_batch.h TaskRows); every task gets
// the model's error if the run fails. The torch boundary of the worker: stacking, the run and the
// row slices may all throw, and an exception here would end the process with every step in
// flight. Adds the stack, model and split times to `phases`.
std::vector<absl::StatusOr<model::BackboneOutput>> RunAndSplit(model::StepRunner& model,
                                                               const std::vector<StepTask*>& tasks,
                                                               int shares, BatchPhases& phases) {
  std::vector<const model::StepInputs*> inputs;
  std::vector<const model::OutputSelection*> plans;
  for (StepTask* task : tasks) {
    inputs.push_back(&task->inputs());
    plans.push_back(&task->plan());
  }
  const model::OutputSelection every = model::WantedByAll(plans);
  std::vector<absl::StatusOr<model::BackboneOutput>> outputs;
  try {
    absl::Time t = absl::Now();
    const model::StepInputs stacked = StackSteps(inputs);
    phases.stack = absl::Now() - t;
    t = absl::Now();
    absl::StatusOr<model::BackboneOutput> out =
        model.Run(stacked, model::WantedByAny(plans), shares);
    phases.model = absl::Now() - t;
    t = absl::Now();
    int64_t row = 0;
    for (StepTask* task : tasks) {
      if (out.ok()) {
        outputs.push_back(TaskRows(*out, row, task->rows(), task->plan(), every));
      } else {
        outputs.push_back(out.status());
      }
      row += task->rows();
    }
    phases.split = absl::Now() - t;
  } catch (const std::exception& e) {
    outputs.assign(tasks.size(),
                   absl::InternalError(absl::StrCat("running the batch: ", e.what())));
  }
  return outputs;
}

}  // namespace

absl::Duration RunStepBatch(model::StepRunner& model, ServerMetrics& metrics,
                            std::vector<std::unique_ptr<batching::Task>> batch, int shares,
                            AnswerPipeline* answers) {
  std::vector<StepTask*> tasks;
  int64_t rows = 0;
  for (const auto& t : batch) {
    tasks.push_back(static_cast<StepTask*>(t.get()));
    rows += t->rows();
  }
  const absl::Time start = absl::Now();
  BatchPhases phases;
  std::vector<absl::StatusOr<model::BackboneOutput>> outputs =
      RunAndSplit(model, tasks, shares, phases);
  const absl::Duration compute = absl::Now() - start;
  metrics.ObserveBatch(rows, compute, shares > 1);
  AnswerPipeline::Answer answer = [&metrics, batch = std::move(batch), tasks, rows, start, compute,
                                   phases, outputs = std::move(outputs)]() mutable {
    const absl::Time begin = absl::Now();
    for (size_t i = 0; i < tasks.size(); ++i) {
      const absl::Duration queued = start - tasks[i]->accepted();
      metrics.ObserveQueue(queued);
      if (!outputs[i].ok()) {
        tasks[i]->Complete(outputs[i].status());
        continue;
      }
      tasks[i]->Complete(
          StepResult{*std::move(outputs[i]), tasks[i]->layout_key(), queued, compute, rows});
    }
    phases.answer = absl::Now() - begin;
    metrics.ObserveBatchPhases(phases);
  };
  if (answers != nullptr && answers->Offer(answer)) {
    metrics.CountPipelinedAnswers();
    return compute;
  }
  std::move(answer)();
  return compute;
}

}  // namespace praxis::serve
