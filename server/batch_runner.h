#pragma once

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "model/step_runner.h"
#include "server/answer_pipeline.h"
#include "server/batching/task.h"
#include "server/metrics.h"

namespace praxis::serve {

// The batcher's Runner: stacks the rows of a batch of StepTasks (one layout key), runs the model
// once for the outputs any of them asked for, and answers each task with exactly its own rows of
// the outputs it asked for. If the run fails, every task gets the model's error. Runs on a batcher
// worker; the tasks must all be StepTasks. The answers are offered to `answers` (when not null),
// which may run them on its own thread while the worker goes on; otherwise they run here.
// `shares` as the batcher's Runner's (StepRunner::Run's). Returns the model's time for the batch
// (what the batcher's sizer learns from).
absl::Duration RunStepBatch(model::StepRunner& model, ServerMetrics& metrics,
                            std::vector<std::unique_ptr<batching::Task>> batch, int shares = 1,
                            AnswerPipeline* answers = nullptr);

}  // namespace praxis::serve
