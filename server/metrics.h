#pragma once

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "model/mask_cache.h"
#include "model/step_graphs.h"
#include "model/step_runner.h"

namespace praxis::serve {

// Levels read when /metrics is scraped, rather than counted as they happen.
struct LiveValues {
  int64_t queued_requests = 0;
  int64_t queued_bytes = 0;
  model::MaskCacheStats mask_cache;
  CacheStats text_cache;  // zero where the model keeps none
  std::optional<int64_t> device_memory_bytes;
  std::optional<model::GraphStats> graphs;  // absent where steps run eagerly
  std::optional<model::IntraOpThreads> intra_op_threads;  // CPU (StepRunner::intra_op_threads)
  int64_t pending_response_bytes = 0;       // answers admitted but not yet taken by their readers
  int64_t session_text_bytes = 0;           // texts kept by sessions
  int64_t write_timeouts = 0;               // calls cancelled for a stalled reader
  // Rows the batch sizer holds each layout's batches to now, per layout key it remembers (at
  // most --mask_cache_entries of them; none with --batch_probe_every=0).
  std::vector<std::pair<std::string, int64_t>> batch_rows_held;
};

// Where one batch's time went (praxis_batch_phase_seconds): on the batcher's worker, and for the
// answer there or on the answer pipeline's thread.
struct BatchPhases {
  absl::Duration stack, model, split, answer;
};

// What praxis_model_info labels.
struct ModelLabels {
  std::string model;  // checkpoint directory or "embedded:tiny"; labelled by its last component
  std::string device;
  std::string dtype;
  std::string layers;  // "dim 64, encoder 3, decoder 2"
};

// The server's Prometheus metrics (SPEC §7) in one registry, served at /metrics by Expose. All
// methods are thread-safe; `live` is called on the exposer's thread at each scrape.
class ServerMetrics {
 public:
  ServerMetrics(const ModelLabels& model, std::function<LiveValues()> live);
  ~ServerMetrics();

  // Serves /metrics on `address` ("0.0.0.0:9090", or "127.0.0.1:9090" for this host only; port 0
  // picks one). Unavailable naming the address when the HTTP server cannot start.
  absl::Status Expose(const std::string& address);
  // The port Expose bound, or 0 before.
  int port() const;

  // One finished call or session step, by method ("Step", "Session", "GetModelInfo").
  void CountRequest(absl::string_view method, absl::StatusCode code);
  void ObserveLatency(absl::string_view method, absl::Duration d);
  void ObserveQueue(absl::Duration d);
  // One batch run: its rows, model time, and whether it ran beside another (--concurrent_batches).
  void ObserveBatch(int64_t rows, absl::Duration compute, bool beside_another);
  // One batch's time by phase: stacking the rows, the model (on CUDA with the inputs' staging and
  // the wanted outputs' copy to the host), splitting the outputs per call, and answering (each
  // call's first message built and queued, on the worker or the answer pipeline's thread).
  void ObserveBatchPhases(const BatchPhases& phases);
  // One batch whose answers the answer pipeline took (server/answer_pipeline.h).
  void CountPipelinedAnswers();
  void AddReceivedBytes(int64_t n);
  void AddSentBytes(int64_t n);
  void SetServing(bool serving);

  prometheus::Registry& registry() { return *registry_; }

 private:
  class LiveCollector;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<LiveCollector> live_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Histogram& queue_;
  prometheus::Histogram& compute_;
  prometheus::Histogram& batch_rows_;
  prometheus::Family<prometheus::Histogram>& batch_phases_;
  prometheus::Counter& pipelined_;
  prometheus::Counter& computed_rows_;
  prometheus::Counter& side_by_side_;
  prometheus::Counter& received_;
  prometheus::Counter& sent_;
  prometheus::Gauge& serving_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace praxis::serve
