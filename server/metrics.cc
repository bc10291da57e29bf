#include "server/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace praxis::serve {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

const prometheus::Histogram::BucketBoundaries& SecondsBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *b;
}

// The model's name as a label: the last component of a checkpoint directory or config path, never
// the path, which would tell every scraper how the host's disks are laid out.
std::string ModelLabel(std::string model) {
  while (model.size() > 1 && model.back() == '/') model.pop_back();
  const size_t slash = model.rfind('/');
  return slash == std::string::npos ? model : model.substr(slash + 1);
}

MetricFamily Family(std::string name, std::string help, MetricType type, double value) {
  ClientMetric m;
  (type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
  return MetricFamily{std::move(name), std::move(help), type, {m}};
}

}  // namespace

// Turns LiveValues into metric families at scrape time.
class ServerMetrics::LiveCollector : public prometheus::Collectable {
 public:
  explicit LiveCollector(std::function<LiveValues()> live) : live_(std::move(live)) {}

  std::vector<MetricFamily> Collect() const override {
    const LiveValues v = live_();
    const auto& mc = v.mask_cache;
    const auto& tc = v.text_cache;
    std::vector<MetricFamily> out = {
        Family("praxis_queue_depth", "Requests queued in the batcher, all layout keys.",
               MetricType::Gauge, v.queued_requests),
        Family("praxis_queue_bytes", "Input bytes queued in the batcher.", MetricType::Gauge,
               v.queued_bytes),
        Family("praxis_mask_cache_hits_total", "Mask-cache lookups answered by an entry.",
               MetricType::Counter, mc.hits),
        Family("praxis_mask_cache_misses_total", "Mask-cache lookups that built the entry.",
               MetricType::Counter, mc.misses),
        Family("praxis_mask_cache_evictions_total", "Mask-cache entries evicted.",
               MetricType::Counter, mc.evictions),
        Family("praxis_mask_cache_entries", "Tower layouts held in the mask cache.",
               MetricType::Gauge, mc.entries),
        Family("praxis_mask_cache_bytes", "Bytes the cached masks and plans hold.",
               MetricType::Gauge, mc.bytes),
        Family("praxis_text_cache_hits_total",
               "Text rows whose projected tokens came from the text cache.", MetricType::Counter,
               tc.hits),
        Family("praxis_text_cache_misses_total", "Text rows projected and cached.",
               MetricType::Counter, tc.misses),
        Family("praxis_text_cache_evictions_total", "Projected texts evicted.", MetricType::Counter,
               tc.evictions),
        Family("praxis_text_cache_entries", "Texts held in the text cache.", MetricType::Gauge,
               tc.entries),
        Family("praxis_text_cache_bytes", "Bytes the cached texts and their tokens hold.",
               MetricType::Gauge, tc.bytes),
        Family("praxis_pending_response_bytes",
               "Answer bytes admitted but not yet taken by their readers.", MetricType::Gauge,
               v.pending_response_bytes),
        Family("praxis_session_text_bytes",
               "Text bytes kept for Session steps that leave text out.", MetricType::Gauge,
               v.session_text_bytes),
        Family("praxis_write_timeouts_total",
               "Calls cancelled because their reader took no data for --write_timeout.",
               MetricType::Counter, v.write_timeouts),
    };
    // One series per layout the sizer remembers (none before a batch, or with it off): bounded
    // by its key limit, whatever layouts clients send.
    MetricFamily held{"praxis_batch_rows_held",
                      "Rows the batch sizer holds this layout's batches to now "
                      "(--batch_probe_every): fewer than --max_batch_size where batching that "
                      "layout does not raise its rows per second.",
                      MetricType::Gauge,
                      {}};
    for (const auto& [layout, rows] : v.batch_rows_held) {
      ClientMetric m;
      m.label.push_back({"layout", layout});
      m.gauge.value = static_cast<double>(rows);
      held.metric.push_back(std::move(m));
    }
    out.push_back(std::move(held));
    if (v.device_memory_bytes) {
      out.push_back(Family("praxis_device_memory_bytes",
                           "Bytes the device allocator holds for the model.", MetricType::Gauge,
                           static_cast<double>(*v.device_memory_bytes)));
    }
    if (v.graphs) AddGraphFamilies(*v.graphs, out);
    if (v.intra_op_threads) {
      out.push_back(Family("praxis_intra_op_threads",
                           "Intra-op threads of the last CPU step: --threads, or fewer where "
                           "fewer ran faster (--thread_probe_every).",
                           MetricType::Gauge, static_cast<double>(v.intra_op_threads->threads)));
      out.push_back(
          Family("praxis_intra_op_thread_switches_total",
                 "Changes of the CPU steps' intra-op thread count (--thread_probe_every).",
                 MetricType::Counter, static_cast<double>(v.intra_op_threads->switches)));
    }
    return out;
  }

 private:
  static void AddGraphFamilies(const model::GraphStats& g, std::vector<MetricFamily>& out) {
    out.push_back(Family("praxis_cuda_graph_hits_total",
                         "Batches replayed from a captured CUDA graph (or its eager fallback).",
                         MetricType::Counter, g.cache.hits));
    out.push_back(Family("praxis_cuda_graph_misses_total",
                         "Batches whose (layout, rows) was captured first.", MetricType::Counter,
                         g.cache.misses));
    out.push_back(Family("praxis_cuda_graph_evictions_total",
                         "Captured graphs dropped to stay within --cuda_graph_bytes.",
                         MetricType::Counter, g.cache.evictions));
    out.push_back(Family("praxis_cuda_graph_entries", "Captured (layout, rows) held now.",
                         MetricType::Gauge, g.cache.entries));
    out.push_back(Family("praxis_cuda_graph_bytes",
                         "Device bytes the captured graphs' buffers and pools hold.",
                         MetricType::Gauge, g.cache.bytes));
    out.push_back(Family("praxis_cuda_graph_capture_failures_total",
                         "Captures that failed; those layouts run eagerly.", MetricType::Counter,
                         g.capture_failures));
    out.push_back(Family("praxis_cuda_graph_over_budget_total",
                         "Graphs dropped after capture for holding more than --cuda_graph_bytes "
                         "alone; those (layout, rows) run eagerly.",
                         MetricType::Counter, g.over_budget));
  }

  std::function<LiveValues()> live_;
};

ServerMetrics::ServerMetrics(const ModelLabels& model, std::function<LiveValues()> live)
    : registry_(std::make_shared<prometheus::Registry>()),
      live_(std::make_shared<LiveCollector>(std::move(live))),
      requests_(prometheus::BuildCounter()
                    .Name("praxis_requests_total")
                    .Help("Finished calls and session steps, by method and status code.")
                    .Register(*registry_)),
      latency_(prometheus::BuildHistogram()
                   .Name("praxis_latency_seconds")
                   .Help("End-to-end time of a step, accepted to last byte written, by method.")
                   .Register(*registry_)),
      queue_(prometheus::BuildHistogram()
                 .Name("praxis_queue_seconds")
                 .Help("Time a step waited in the batcher before its batch ran.")
                 .Register(*registry_)
                 .Add({}, SecondsBuckets())),
      compute_(prometheus::BuildHistogram()
                   .Name("praxis_compute_seconds")
                   .Help("Model time of one batch.")
                   .Register(*registry_)
                   .Add({}, SecondsBuckets())),
      batch_rows_(prometheus::BuildHistogram()
                      .Name("praxis_batch_rows")
                      .Help("Rows of each batch run.")
                      .Register(*registry_)
                      .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64})),
      batch_phases_(prometheus::BuildHistogram()
                        .Name("praxis_batch_phase_seconds")
                        .Help("A batch's time by phase: stack, model (on CUDA with staging and "
                              "the outputs' copy to the host), split, on the batcher's worker; "
                              "answer, there or on the answer pipeline's thread.")
                        .Register(*registry_)),
      pipelined_(prometheus::BuildCounter()
                     .Name("praxis_pipelined_answers_total")
                     .Help("Batches answered on the answer pipeline's thread while the worker "
                           "went on to the next batch.")
                     .Register(*registry_)
                     .Add({})),
      computed_rows_(prometheus::BuildCounter()
                         .Name("praxis_computed_rows_total")
                         .Help("Rows run through the model.")
                         .Register(*registry_)
                         .Add({})),
      side_by_side_(prometheus::BuildCounter()
                        .Name("praxis_side_by_side_batches_total")
                        .Help("Batches run beside another on one intra-op thread "
                              "(--concurrent_batches), not alone on all of them.")
                        .Register(*registry_)
                        .Add({})),
      received_(prometheus::BuildCounter()
                    .Name("praxis_received_bytes_total")
                    .Help("Bytes of step requests received.")
                    .Register(*registry_)
                    .Add({})),
      sent_(prometheus::BuildCounter()
                .Name("praxis_sent_bytes_total")
                .Help("Bytes of step responses sent.")
                .Register(*registry_)
                .Add({})),
      serving_(prometheus::BuildGauge()
                   .Name("praxis_serving")
                   .Help("1 while the server accepts steps (warmed up, not draining).")
                   .Register(*registry_)
                   .Add({})) {
  prometheus::BuildGauge()
      .Name("praxis_model_info")
      .Help("The model this server holds (always 1).")
      .Register(*registry_)
      .Add({{"model", ModelLabel(model.model)},
            {"device", model.device},
            {"dtype", model.dtype},
            {"layers", model.layers}})
      .Set(1);
}

ServerMetrics::~ServerMetrics() = default;

absl::Status ServerMetrics::Expose(const std::string& address) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics: cannot serve HTTP on ", address, ": ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(live_);
  return absl::OkStatus();
}

int ServerMetrics::port() const {
  if (!exposer_) return 0;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void ServerMetrics::CountRequest(absl::string_view method, absl::StatusCode code) {
  requests_.Add({{"method", std::string(method)}, {"code", absl::StatusCodeToString(code)}})
      .Increment();
}

void ServerMetrics::ObserveLatency(absl::string_view method, absl::Duration d) {
  latency_.Add({{"method", std::string(method)}}, SecondsBuckets())
      .Observe(absl::ToDoubleSeconds(d));
}

void ServerMetrics::ObserveQueue(absl::Duration d) { queue_.Observe(absl::ToDoubleSeconds(d)); }

void ServerMetrics::ObserveBatch(int64_t rows, absl::Duration compute, bool beside_another) {
  batch_rows_.Observe(static_cast<double>(rows));
  compute_.Observe(absl::ToDoubleSeconds(compute));
  computed_rows_.Increment(static_cast<double>(rows));
  if (beside_another) side_by_side_.Increment();
}

void ServerMetrics::ObserveBatchPhases(const BatchPhases& phases) {
  for (const auto& [name, d] :
       {std::pair{"stack", phases.stack}, std::pair{"model", phases.model},
        std::pair{"split", phases.split}, std::pair{"answer", phases.answer}}) {
    batch_phases_.Add({{"phase", name}}, SecondsBuckets()).Observe(absl::ToDoubleSeconds(d));
  }
}

void ServerMetrics::CountPipelinedAnswers() { pipelined_.Increment(); }

void ServerMetrics::AddReceivedBytes(int64_t n) { received_.Increment(static_cast<double>(n)); }
void ServerMetrics::AddSentBytes(int64_t n) { sent_.Increment(static_cast<double>(n)); }
void ServerMetrics::SetServing(bool serving) { serving_.Set(serving ? 1 : 0); }

}  // namespace praxis::serve
