#pragma once

// A StepRunner without the model, for tests about serving (batching, chunking, sessions,
// cancellation, deadlines, drain, budgets, metrics) rather than numerics.

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "model/step_runner.h"

namespace praxis::serve::fixtures {

struct FakeStepRunnerOptions {
  // The config the fake describes and validates against; unset: the embedded tiny model's.
  std::optional<model::BackboneConfig> config;
  std::string device = "cpu";
  std::string dtype = "float32";  // of every output but positions (int64)
};

// Answers each batch with cheap outputs of the real model's shapes, dtypes and spans, computed row
// by row from the inputs (so a caller can tell its rows from another's, and a batch answers each
// row as that row alone would be answered): see Outputs. It can hold batches at a gate (so tests
// can fill queues, let deadlines pass or cancel calls while a batch is known to be running), fail
// or slow the next batches, and counts what ran and which outputs each batch asked for. Its
// mask-cache stats count one lookup per batch, keyed by layout. Thread-safe.
class FakeStepRunner : public model::StepRunner {
 public:
  explicit FakeStepRunner(FakeStepRunnerOptions options = {});

  // What Run answers for `batch`, without gating, failing or counting: a test's expected outputs.
  // velocity = noised * 2 + the row's timestep of each frame (with decode); cond = each token's
  // mean over channels, in every feature; embeddings = the row's text mean + token index; tap i =
  // embeddings + i + 1; positions = token index. `batch` must have passed ValidateStep.
  static model::BackboneOutput Outputs(const model::BackboneConfig& config,
                                       const model::StepInputs& batch, torch::ScalarType dtype);

  // Batches entering Run wait (bounded) until Open; the gate starts open.
  void Close();
  void Open();
  // The next batch throws from Run, as a LibTorch failure would.
  void ThrowNext();
  // The next batch returns `status` (not OK) from Run, as a model error would.
  void FailNext(absl::Status status);
  // Each batch from now on takes at least `delay` after passing the gate: a slow model.
  void SetDelay(absl::Duration delay);
  // Waits (bounded) until `n` batches in all have entered Run.
  bool WaitEntered(int64_t n, absl::Duration timeout = absl::Seconds(60));
  // Run calls with valid inputs so far, counted on entry (held, failed and thrown ones included).
  int64_t batches_entered() const;
  // Rows of the batches that passed the gate (failed and thrown ones included).
  int64_t rows_run() const;
  // What each batch that passed the gate asked for, in order (failed and thrown ones included).
  std::vector<model::OutputSelection> wanted() const;

  const model::BackboneConfig& config() const override { return config_; }
  model::MaskCacheStats mask_cache_stats() const override;
  std::string device() const override { return device_; }
  std::string dtype() const override { return dtype_name_; }
  std::optional<int64_t> device_memory_bytes() const override { return std::nullopt; }

 protected:
  // The outputs `wanted` selects (as Outputs, the others undefined), after the gate and failures;
  // `shares` is ignored.
  absl::StatusOr<model::BackboneOutput> RunOnShare(const model::StepInputs& batch,
                                                   const model::OutputSelection& wanted,
                                                   int shares) override;

 private:
  const model::BackboneConfig config_;
  const std::string device_;
  const std::string dtype_name_;
  const torch::ScalarType dtype_;
  mutable absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  bool throw_next_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fail_next_ ABSL_GUARDED_BY(mu_);
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  int64_t entered_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rows_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<model::OutputSelection> wanted_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> layouts_ ABSL_GUARDED_BY(mu_);
  model::MaskCacheStats mask_stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace praxis::serve::fixtures
