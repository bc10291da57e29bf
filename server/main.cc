// praxis-server: serves the Praxis video backbone over gRPC (SPEC §7). Flags below; any of them
// can also come from a file with --flagfile=PATH (one --flag=value per line).

#include <ATen/cuda/CUDAContext.h>
#include <pthread.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/file_util.h"
#include "common/flag_lists.h"
#include "common/status_macros.h"
#include "common/usage.h"
#include "model/cpu_kernels.h"
#include "model/cpu_runtime.h"
#include "model/model_loader.h"
#include "model/step_runner.h"
#include "nlohmann/json.hpp"
#include "server/server.h"
#include "wire/layout_key.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "address to serve gRPC on");
ABSL_FLAG(int32_t, port, 50051, "gRPC port; 0 picks a free one (logged at start)");
ABSL_FLAG(int32_t, metrics_port, 9090, "Prometheus /metrics HTTP port; 0 picks one, -1 disables");
ABSL_FLAG(std::string, metrics_host, "0.0.0.0",
          "address to serve /metrics on; 0.0.0.0 lets Prometheus scrape the pod, 127.0.0.1 keeps "
          "it on this host");
ABSL_FLAG(bool, reflection, true, "serve gRPC server reflection (grpcurl list/describe)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of bearer tokens, one per line; when set, every call must carry "
          "'authorization: Bearer <token>'; empty: no authentication");
ABSL_FLAG(bool, auth_exempt_health, true,
          "with --auth_token_file, health checks need no token (for Kubernetes probes)");
ABSL_FLAG(std::string, checkpoint, "",
          "checkpoint directory (config.json + safetensors); empty serves the embedded tiny model");
ABSL_FLAG(std::string, config, "",
          "with no --checkpoint: a config.json served with deterministic random weights");
ABSL_FLAG(uint64_t, seed, 0, "seed of the random weights when no --checkpoint is given");
ABSL_FLAG(std::string, load, "copy",
          "copy | mmap: read the checkpoint into memory, or map it (SIGBUS if the file shrinks)");
ABSL_FLAG(std::string, device, "cpu", "cpu | cuda | cuda:N");
ABSL_FLAG(std::string, dtype, "", "float32 | bfloat16 | float16; empty keeps the checkpoint's");
ABSL_FLAG(std::string, attention, "sparse", "sparse | dense");
ABSL_FLAG(int32_t, threads, 0,
          "LibTorch intra-op threads of the thread that runs the model (every other thread uses "
          "one); 0: the number of cores on cpu, 1 on cuda (its host work is copies)");
ABSL_FLAG(absl::Duration, thread_probe_every, absl::Seconds(2),
          "on cpu with --threads of 2 or more: after this much model time on its thread count, "
          "the worker times one thread fewer or more (1 to --threads) on a few runs and keeps the "
          "faster (a spinning team loses ~10x to a busy process on its cores); 0: always --threads");
ABSL_FLAG(int32_t, concurrent_batches, 0,
          "on cpu: while more than one batch is ready, up to this many (at most --threads) run "
          "side by side, each on one intra-op thread; a batch with none other ready or running "
          "takes all --threads. 1: one batch at a time. 0: 2 where --threads is 2 (measured on "
          "2 cores), else 1. cuda runs one");
ABSL_FLAG(int64_t, mask_cache_entries, 64,
          "tower layouts whose masks stay cached (and, apart, step layouts whose plans do)");
ABSL_FLAG(int64_t, mask_cache_bytes, int64_t{256} << 20,
          "bytes the cached masks and attention plans may hold (least recently used evicted)");
ABSL_FLAG(int64_t, text_cache_entries, 64,
          "on cpu, instructions whose projected text tokens stay cached, by the text's bytes (a "
          "robot sends the same one every step); 0 projects every row's text every step");
ABSL_FLAG(int64_t, text_cache_bytes, int64_t{128} << 20,
          "bytes the cached texts and their tokens may hold (least recently used evicted)");
ABSL_FLAG(int64_t, max_batch_size, 8, "a batch closes at this many rows");
ABSL_FLAG(
    int64_t, batch_probe_every, 8,
    "batches of one layout between probes of a batch size one step smaller or larger: each "
    "layout's batches hold the fewest rows (a power of two up to --max_batch_size) whose rows "
    "per second of the worker come within 10% of its best size measured, so a layout that "
    "batching does not speed up runs a row at a time; 0: every batch may fill to "
    "--max_batch_size");
ABSL_FLAG(absl::Duration, max_queue_delay, absl::ZeroDuration(),
          "... or this long after its oldest request arrived. 0: a batch starts as soon as the "
          "worker is free, and requests that arrive while it computes form the next one (measured "
          "best at 1 and 8 callers; waiting only pays for sparse open-loop traffic)");
ABSL_FLAG(std::string, answer_pipeline, "auto",
          "auto | on | off: answer a batch on a thread of its own while the worker starts the next "
          "one (only when another waits). auto: on where the model's --threads leave a core free "
          "(cuda's default), off where they take every core (measured slower on a 2-core CPU: the "
          "answering thread takes the model's cores)");
ABSL_FLAG(int64_t, max_float32_weight_bytes, int64_t{1} << 30,
          "bytes of float32 weights the CPU may hold where LibTorch's 16-bit GEMM is emulated or "
          "the slower one (the start-up line says): a bf16/fp16 model within it is computed in "
          "float32; beyond it, float32 copies of its matmul weights fill what is left. bf16 "
          "SwiGLU weights packed for oneDNN's brgemm (AMX, AVX512-BF16) count here too");
ABSL_FLAG(int64_t, max_queue_requests, 1024, "queued requests beyond which RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_queue_bytes, int64_t{1} << 30, "queued input bytes beyond which the same");
ABSL_FLAG(int64_t, max_chunk_bytes, 1 << 20, "largest TensorChunk payload (>= 8)");
ABSL_FLAG(int64_t, max_message_bytes, 0,
          "largest request message; 0: the largest legal request of the loaded model under the "
          "limits below (printed at start)");
ABSL_FLAG(double, max_request_cost, 100,
          "useful GFLOP of one request (matmuls + attention over allowed pairs, all its rows); "
          "more is refused RESOURCE_EXHAUSTED. 100 is about a second on the embedded model with "
          "2 CPU cores: raise it for GPUs");
ABSL_FLAG(double, max_batch_cost, 0,
          "useful GFLOP of one batch: a batch closes before it would exceed it; 0: "
          "--max_request_cost");
ABSL_FLAG(int64_t, max_response_bytes, 0,
          "tensor bytes of one answer; 0: the largest legal answer of the loaded model");
ABSL_FLAG(int64_t, max_pending_response_bytes, int64_t{512} << 20,
          "answer bytes admitted but not yet taken by their readers, all calls; beyond it new "
          "steps are refused RESOURCE_EXHAUSTED, never computed");
ABSL_FLAG(int64_t, max_session_text_bytes, int64_t{256} << 20,
          "text bytes kept for Session steps that leave text out, all sessions; a session whose "
          "text does not fit keeps none and must send text with every step; 0: none kept");
ABSL_FLAG(absl::Duration, write_timeout, absl::Seconds(30),
          "a call whose reader takes no data for this long is cancelled and its answer freed");
ABSL_FLAG(int32_t, max_streams_per_connection, 64, "concurrent calls on one HTTP/2 connection");
ABSL_FLAG(int64_t, max_request_memory_bytes, int64_t{1} << 30,
          "gRPC ResourceQuota: memory the server's transport may use for requests");
ABSL_FLAG(double, max_abs_input, 1e4,
          "largest |x| of any float input (text, anchor, clean, noised)");
ABSL_FLAG(int64_t, max_dense_mask_bytes, int64_t{64} << 20,
          "with --attention=dense: largest [T, T] mask of a tower; longer layouts are refused");
ABSL_FLAG(int64_t, max_request_rows, 64, "largest client batch B of one request");
ABSL_FLAG(int64_t, max_text_len, 1024, "longest text L");
ABSL_FLAG(int64_t, max_grid, 128, "largest latent grid side (h, w, anchor)");
ABSL_FLAG(int64_t, max_frames, 64, "most latent frames K*F");
ABSL_FLAG(int64_t, max_tokens, 1 << 17, "longest encoder or decoder sequence");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls_key serves TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key");
ABSL_FLAG(std::string, tls_client_ca, "", "PEM CA; when set, clients must present certificates");
ABSL_FLAG(int32_t, drain_seconds, 30,
          "on SIGTERM/SIGINT, finish queued and in-flight steps within this long, then exit 0");
ABSL_FLAG(std::string, warmup, "16,4,4,2,1",
          "layouts of the warm-up steps before SERVING, ';'-separated: text_len,h,w,K,F (anchor "
          "grid = h x w); on CUDA each one's graph is captured then");
ABSL_FLAG(std::string, warmup_rows, "1",
          "batch rows of the warm-up steps, ','-separated: each --warmup layout runs at each");
ABSL_FLAG(
    bool, cuda_graphs, true,
    "on CUDA, replay a captured graph per (layout, batch rows); false runs every step eagerly");
ABSL_FLAG(int64_t, cuda_graph_bytes, int64_t{8} << 30,
          "device bytes the captured graphs may hold (least recently used evicted beyond)");
ABSL_FLAG(std::string, port_file, "",
          "once SERVING, write {\"port\", \"metrics_port\" (null if off), \"pid\"} as JSON here "
          "(atomically: PATH.tmp, then rename)");

namespace praxis::serve {
namespace {

// The serving options for a model of `config`; limits left at 0 are derived from it.
ServerOptions OptionsFromFlags(const model::BackboneConfig& config, bool dense_attention) {
  ServerOptions o;
  o.address = absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.metrics_address =
      metrics_port < 0 ? "" : absl::StrCat(absl::GetFlag(FLAGS_metrics_host), ":", metrics_port);
  o.reflection = absl::GetFlag(FLAGS_reflection);
  o.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.auth_exempt_health = absl::GetFlag(FLAGS_auth_exempt_health);
  o.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  o.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  o.batch.max_batch_rows = absl::GetFlag(FLAGS_max_batch_size);
  o.batch.max_queue_delay = absl::GetFlag(FLAGS_max_queue_delay);
  o.batch.batch_probe_every = absl::GetFlag(FLAGS_batch_probe_every);
  o.batch.max_sized_layouts = absl::GetFlag(FLAGS_mask_cache_entries);
  o.batch.max_queue_requests = absl::GetFlag(FLAGS_max_queue_requests);
  o.batch.max_queue_bytes = absl::GetFlag(FLAGS_max_queue_bytes);
  o.service.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  StepLimits& l = o.service.limits;
  l.max_rows = absl::GetFlag(FLAGS_max_request_rows);
  l.max_text_len = absl::GetFlag(FLAGS_max_text_len);
  l.max_grid_h = l.max_grid_w = absl::GetFlag(FLAGS_max_grid);
  l.max_frames = absl::GetFlag(FLAGS_max_frames);
  l.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  l.max_abs_input = absl::GetFlag(FLAGS_max_abs_input);
  l.max_request_gflop = absl::GetFlag(FLAGS_max_request_cost);
  l.dense_attention = dense_attention;
  l.max_dense_mask_bytes = absl::GetFlag(FLAGS_max_dense_mask_bytes);
  const double batch_cost = absl::GetFlag(FLAGS_max_batch_cost);
  o.batch.max_batch_cost = batch_cost > 0 ? batch_cost : l.max_request_gflop;
  const MessageBounds largest = LargestLegalStep(config, l);
  l.max_response_bytes = absl::GetFlag(FLAGS_max_response_bytes);
  if (l.max_response_bytes <= 0) l.max_response_bytes = largest.response_bytes;
  if (o.max_message_bytes <= 0) o.max_message_bytes = largest.request_bytes;
  o.service.max_pending_response_bytes = absl::GetFlag(FLAGS_max_pending_response_bytes);
  o.service.max_session_text_bytes = absl::GetFlag(FLAGS_max_session_text_bytes);
  o.service.write_timeout = absl::GetFlag(FLAGS_write_timeout);
  o.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  o.request_memory_bytes = absl::GetFlag(FLAGS_max_request_memory_bytes);
  return o;
}

// Blocks SIGTERM and SIGINT in every thread started after this, so that sigwait sees them.
sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// Writes the ports and the process id as one JSON object to `path`, atomically (a reader sees no
// file or the whole of it): `path`.tmp, then rename(2) over `path`.
absl::Status WritePortFile(const std::string& path, int port, int metrics_port) {
  nlohmann::json j = {{"port", port}, {"metrics_port", nullptr}, {"pid", ::getpid()}};
  if (metrics_port > 0) j["metrics_port"] = metrics_port;
  const std::string tmp = path + ".tmp";
  PRAXIS_RETURN_IF_ERROR(WriteStringToFile(tmp, j.dump() + "\n"));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("--port_file: rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The warm-up steps of --warmup x --warmup_rows; InvalidArgument naming the flag otherwise.
absl::StatusOr<std::vector<WarmupStep>> WarmupFromFlags() {
  PRAXIS_ASSIGN_OR_RETURN(const std::vector<int64_t> rows,
                          ParsePositiveInts(absl::GetFlag(FLAGS_warmup_rows), "--warmup_rows"));
  std::vector<WarmupStep> steps;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_warmup), ';')) {
    PRAXIS_ASSIGN_OR_RETURN(const wire::StepGeometry layout, wire::ParseLayout(text, "--warmup"));
    for (int64_t n : rows) steps.push_back({layout, n});
  }
  return steps;
}

// --answer_pipeline: on (true), off (false), or auto (nullopt: on where the model's threads leave
// a core free, which is known once the model's device is).
absl::StatusOr<std::optional<bool>> AnswerPipelineFromFlag() {
  const std::string v = absl::GetFlag(FLAGS_answer_pipeline);
  if (v == "auto") return std::nullopt;
  if (v == "on" || v == "off") return v == "on";
  return absl::InvalidArgumentError(
      absl::StrCat("--answer_pipeline: expected auto, on or off, got \"", v, "\""));
}

// The model of --checkpoint / --config on --device, with the backbone options it was loaded with,
// and in *compute what the hardware implies for its dtype, also printed: on CPU the CPU's units
// and where matmuls run (a WARNING when bf16/fp16 would be emulated), on CUDA the device.
absl::StatusOr<model::LoadedModel> LoadFromFlags(model::BackboneOptions* backbone,
                                                 std::string* compute) {
  PRAXIS_ASSIGN_OR_RETURN(backbone->device,
                          model::ParseDevice(absl::GetFlag(FLAGS_device), "--device"));
  PRAXIS_ASSIGN_OR_RETURN(backbone->attention,
                          model::ParseAttention(absl::GetFlag(FLAGS_attention), "--attention"));
  backbone->mask_cache_entries = absl::GetFlag(FLAGS_mask_cache_entries);
  backbone->mask_cache_bytes = absl::GetFlag(FLAGS_mask_cache_bytes);
  backbone->text_cache_entries = absl::GetFlag(FLAGS_text_cache_entries);
  backbone->text_cache_bytes = absl::GetFlag(FLAGS_text_cache_bytes);
  if (backbone->text_cache_entries < 0 || backbone->text_cache_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text_cache_entries and --text_cache_bytes must be >= 0, got ",
                     backbone->text_cache_entries, " and ", backbone->text_cache_bytes));
  }
  const model::ModelSource source{.checkpoint = absl::GetFlag(FLAGS_checkpoint),
                                  .config_path = absl::GetFlag(FLAGS_config),
                                  .seed = absl::GetFlag(FLAGS_seed),
                                  .dtype = absl::GetFlag(FLAGS_dtype),
                                  .load = absl::GetFlag(FLAGS_load)};
  PRAXIS_ASSIGN_OR_RETURN(model::LoadedModel loaded, model::LoadModel(source, *backbone));
  bool slow = false;
  if (backbone->device.is_cuda()) {
    const int index = backbone->device.has_index() ? backbone->device.index() : 0;
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(index);
    *compute = absl::StrCat("CUDA device ", index, ": ", p->name, ", ", p->totalGlobalMem >> 20,
                            " MiB, compute capability ", p->major, ".", p->minor);
  } else {
    const torch::ScalarType dtype = loaded.model->dtype();
    const model::Float32Path path =
        loaded.model->compute_dtype() != dtype ? model::Float32Path::kModel
        : model::ReducedGemmInFloat32(dtype)   ? model::Float32Path::kMatmuls
                                               : model::Float32Path::kNone;
    *compute = model::DescribeCpuForDtype(model::DetectCpuIsa(), dtype, model::MatmulSpeedup(dtype),
                                          path, &slow);
  }
  (slow ? std::cerr : std::cout) << "praxis-server: " << (slow ? "WARNING: " : "") << *compute
                                 << std::endl;
  return loaded;
}

// The human start-up line: where it serves, what, and its limits.
void PrintServing(const PraxisServer& server, const ServerOptions& options) {
  const StepLimits& l = options.service.limits;
  std::cout << "praxis-server: serving on " << absl::GetFlag(FLAGS_host) << ":" << server.port()
            << " metrics " << (server.metrics_port() ? absl::StrCat(server.metrics_port()) : "off")
            << " model " << options.model.model << " device " << options.model.device << " dtype "
            << options.model.dtype << " limits batch " << options.batch.max_batch_rows << " delay "
            << absl::FormatDuration(options.batch.max_queue_delay) << " queue "
            << options.batch.max_queue_requests << " rows " << l.max_rows << " text "
            << l.max_text_len << " grid " << l.max_grid_h << " frames " << l.max_frames
            << " tokens " << l.max_tokens << " cost " << l.max_request_gflop << " GFLOP message "
            << options.max_message_bytes << " response " << l.max_response_bytes
            << " answer_pipeline " << (options.answer_pipeline ? "on" : "off")
            << " concurrent_batches " << options.workers << std::endl;
}

// Waits for SIGTERM or SIGINT, drains within --drain_seconds and exits 0 without tearing down.
[[noreturn]] void DrainOnSignal(PraxisServer& server, const sigset_t& stop_signals) {
  int sig = 0;
  sigwait(&stop_signals, &sig);
  const absl::Duration grace = absl::Seconds(absl::GetFlag(FLAGS_drain_seconds));
  std::cout << "praxis-server: signal " << sig << ", draining (grace "
            << absl::FormatDuration(grace) << ")" << std::endl;
  // Exit 0 within the grace in every case: the drain is bounded in phases, and this backstop
  // covers what no phase can interrupt (a LibTorch call that does not return).
  std::thread backstop([grace] {
    absl::SleepFor(grace + absl::Milliseconds(700));
    std::cout << "praxis-server: drain exceeded the grace; exiting" << std::endl;
    std::_Exit(0);
  });
  backstop.detach();
  const bool clean = server.Drain(grace);
  const batching::BatcherStats s = server.batcher_stats();
  const ServiceCounts n = server.service_counts();
  std::cout << "praxis-server: stopped after " << s.batches << " batches: " << n.accepted
            << " steps accepted, " << n.answered_ok << " answered OK, " << n.write_timeouts
            << " cancelled for stalled readers" << std::endl;
  if (!clean)
    std::cout << "praxis-server: a batch outlived the grace; not waiting for it" << std::endl;
  // Nothing is left to answer: skip tearing down a model a wedged batch may still use, and the
  // metrics exposer (about 2 s), so that the exit stays within the grace.
  std::_Exit(0);
}

// A flag's value as AtLeast's message shows it.
std::string FlagValueText(int64_t value) { return absl::StrCat(value); }
std::string FlagValueText(absl::Duration value) { return absl::FormatDuration(value); }

// InvalidArgument naming `flag` when its value is under `least` (a negative byte budget or probe
// interval, no batch at all).
template <typename T>
absl::Status AtLeast(const absl::Flag<T>& flag, std::type_identity_t<T> least) {
  const T value = absl::GetFlag(flag);
  if (!(value < least)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", absl::GetFlagReflectionHandle(flag).Name(),
                                                 " must be >= ", FlagValueText(least), ", got ",
                                                 FlagValueText(value)));
}

// --concurrent_batches resolved: the batcher's workers for a model run on `threads` intra-op
// threads.
absl::StatusOr<int> ConcurrentBatches(int threads, bool cuda) {
  const int n = absl::GetFlag(FLAGS_concurrent_batches);
  if (cuda) return 1;
  if (n == 0) return threads == 2 ? 2 : 1;
  if (n > threads) {
    return absl::InvalidArgumentError(
        absl::StrCat("--concurrent_batches must be at most --threads (", threads,
                     "): each runs on a thread, got ", n));
  }
  return n;
}

absl::Status Run() {
  const sigset_t stop_signals = BlockStopSignals();
  // LibTorch's default count (the cores), taken before every thread is set to one: only the
  // batcher's worker runs the model with more (model/cpu_runtime.h).
  const int cores = at::get_num_threads();
  model::DefaultToOneIntraOpThread();
  PRAXIS_RETURN_IF_ERROR(AtLeast(FLAGS_max_float32_weight_bytes, 0));
  model::cpu::SetFloat32WeightBudget(absl::GetFlag(FLAGS_max_float32_weight_bytes));
  PRAXIS_RETURN_IF_ERROR(AtLeast(FLAGS_max_session_text_bytes, 0));
  PRAXIS_RETURN_IF_ERROR(AtLeast(FLAGS_thread_probe_every, absl::ZeroDuration()));
  PRAXIS_RETURN_IF_ERROR(AtLeast(FLAGS_batch_probe_every, 0));
  PRAXIS_RETURN_IF_ERROR(AtLeast(FLAGS_concurrent_batches, 0));
  PRAXIS_ASSIGN_OR_RETURN(const std::vector<WarmupStep> warmup, WarmupFromFlags());
  PRAXIS_ASSIGN_OR_RETURN(const std::optional<bool> answer_pipeline, AnswerPipelineFromFlag());
  model::BackboneOptions backbone;
  std::string compute;
  PRAXIS_ASSIGN_OR_RETURN(model::LoadedModel loaded, LoadFromFlags(&backbone, &compute));
  // On CUDA the worker's own work is copies and small host ops: a team of one thread per core,
  // spinning between them, would only take the cores gRPC's threads answer on (on a CPU a
  // spinning team tripled an answer's time, docs/benchmarks.md stop 27).
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                      : backbone.device.is_cuda()      ? 1
                                                       : cores;
  const model::BackboneConfig& c = loaded.model->config();
  ServerOptions options = OptionsFromFlags(c, backbone.attention == model::AttentionMode::kDense);
  options.answer_pipeline = answer_pipeline.value_or(threads < cores);
  PRAXIS_ASSIGN_OR_RETURN(options.workers, ConcurrentBatches(threads, backbone.device.is_cuda()));
  auto runner = std::make_unique<model::BackboneStepRunner>(
      std::move(loaded.model),
      model::RunnerOptions{.intra_op_threads = threads,
                           .thread_probe_every = absl::GetFlag(FLAGS_thread_probe_every),
                           .cuda_graph_bytes = absl::GetFlag(FLAGS_cuda_graphs)
                                                   ? absl::GetFlag(FLAGS_cuda_graph_bytes)
                                                   : 0});
  options.model = {
      loaded.name, runner->device(), runner->dtype(),
      absl::StrCat("dim ", c.dim, ", encoder ", c.encoder.depth, ", decoder ", c.decoder.depth)};
  options.config_json = loaded.config_json;
  options.compute = std::move(compute);
  PRAXIS_ASSIGN_OR_RETURN(auto server, PraxisServer::Create(options, std::move(runner)));
  PRAXIS_RETURN_IF_ERROR(server->Warmup(warmup));
  PrintServing(*server, options);
  // After the human line, so that whoever sees the file finds the line already printed.
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    PRAXIS_RETURN_IF_ERROR(WritePortFile(port_file, server->port(), server->metrics_port()));
  }
  DrainOnSignal(*server, stop_signals);
}

}  // namespace
}  // namespace praxis::serve

int main(int argc, char** argv) {
  praxis::SetUsage(
      "Serves the Praxis video backbone over gRPC.\n  praxis-server [--checkpoint DIR] [--port N] "
      "[--flagfile FILE] ...");
  absl::ParseCommandLine(argc, argv);
  const absl::Status s = praxis::serve::Run();
  if (!s.ok()) {
    std::cerr << "praxis-server: " << s << std::endl;
    return 2;
  }
  return 0;
}
