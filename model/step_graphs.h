#pragma once

// CUDA graphs of the forward, one per (layout key, batch rows): a denoising step of a layout seen
// before is one graph launch instead of a few thousand kernel launches from the host.

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/shared_lru_cache.h"
#include "model/backbone.h"

namespace at::cuda {
struct CUDAGraph;
}

namespace praxis::model {

// One captured forward: the static device inputs the graph reads, the pinned host buffers they
// are staged through, the outputs the graph writes (overwritten by every replay) and the layout's
// plan. `graph` is null when the capture failed: the layout then runs eagerly, and `failure` says
// why (cached too, so that a layout that cannot be captured is not tried again at every batch).
struct CapturedStep {
  CapturedStep();
  CapturedStep(CapturedStep&&) noexcept;
  ~CapturedStep();

  LayoutPlan plan;
  StepInputs inputs;   // on the device
  StepInputs staging;  // pinned host tensors of the same shapes
  BackboneOutput outputs;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  std::string failure;
  int64_t bytes = 0;  // device bytes it holds: the static inputs and the graph's memory pool

  int64_t nbytes() const { return bytes; }
};

// Counters of the graph cache, and the captures that failed (their layouts run eagerly).
struct GraphStats {
  CacheStats cache;
  int64_t capture_failures = 0;
};

// Runs a VideoBackbone on CUDA through captured graphs, capturing each (layout key, rows) on first
// use and keeping the captures in a SharedLruCache bounded by device bytes. Captures in
// cudaStreamCaptureModeGlobal, where any host synchronisation fails the capture: a capture that
// succeeds is the proof that the forward never waits on the device. A capture that fails is
// logged once (stderr) and its layout falls back to the eager forward.
// Not thread-safe: one batcher worker runs it (the replayed buffers are shared); stats() may be
// called from any thread. The model must outlive it.
class StepGraphs {
 public:
  StepGraphs(VideoBackbone& model, int64_t max_bytes);

  // One step of validated host inputs `batch`: copies them into the graph's static inputs
  // (through pinned memory, on a copy stream the compute stream waits for), replays, and returns
  // the outputs still on the device — valid until the next Run. Internal for a LibTorch failure.
  absl::StatusOr<BackboneOutput> Run(const StepInputs& batch);

  // Captures the graph of `batch`'s layout and rows now (warm-up, before health says SERVING);
  // the error of a failed capture, which Run would have logged and run eagerly.
  absl::Status Capture(const StepInputs& batch);

  GraphStats stats() const;

 private:
  // The cached capture of `batch`'s (layout key, rows), capturing it on a miss.
  absl::StatusOr<std::shared_ptr<const CapturedStep>> Get(const StepInputs& batch);
  // Stages, warms up and captures one forward of `batch`; a CapturedStep with a null graph and
  // the reason when capturing throws.
  absl::StatusOr<CapturedStep> Build(const StepInputs& batch);

  VideoBackbone& model_;
  SharedLruCache<std::string, CapturedStep> cache_;
  std::atomic<int64_t> capture_failures_{0};
};

}  // namespace praxis::model
