// step_bench: times the server's StepRunner on one step file, for bench/compare_reference.py to put
// beside the PyTorch reference's forward on the same checkpoint, inputs and thread count, or on
// synthetic inputs of a layout, for bench/served_ratio.py to put beside the served step.
// Prints one JSON line (last): {"times_ms": [...], "median_ms": m} (with --gemm_bound also
// "gemm_ms", "gemm_calls", "gemm_gflop", "attention_products_ms", "attention_products_calls",
// "attention_products_gflop", "useful_gflop"). Not a test: nothing is asserted.

#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bench/gemm_record.h"
#include "bench/stats.h"
#include "common/status_macros.h"
#include "model/cpu_runtime.h"
#include "model/model_loader.h"
#include "model/step_cost.h"
#include "model/step_runner.h"
#include "wire/layout_key.h"
#include "wire/step_file.h"
#include "wire/synthetic.h"

ABSL_FLAG(std::string, checkpoint, "", "checkpoint directory (config.json + safetensors)");
ABSL_FLAG(std::string, config, "",
          "with no --checkpoint: a config.json with praxis-server's random weights (seed 0); "
          "neither: the embedded tiny model");
ABSL_FLAG(
    std::string, dtype, "",
    "parameter dtype to convert to at load (default: the file's); a 16-bit one is computed "
    "in float32 where its GEMM is the slower one (PRAXIS_REDUCED_GEMM_IN_FLOAT32=0 keeps it)");
ABSL_FLAG(std::string, attention, "sparse", "sparse | dense (praxis-server's --attention)");
ABSL_FLAG(std::string, inputs, "", "step file (text, anchor, [clean], noised, timesteps, ...)");
ABSL_FLAG(std::string, layout, "",
          "without --inputs: synthetic inputs of this layout (text_len,h,w,K,F; praxis-load's "
          "--mix form), --rows rows");
ABSL_FLAG(int64_t, text_cache_entries, 64,
          "texts whose projected tokens stay cached (praxis-server's --text_cache_entries); 0 "
          "projects every row's text every step, as the PyTorch reference does");
ABSL_FLAG(int64_t, rows, 1, "rows of the synthetic inputs (--layout)");
ABSL_FLAG(int32_t, threads, 2, "LibTorch intra-op threads");
ABSL_FLAG(int32_t, repeats, 5, "timed runs (after one untimed warm-up run)");
ABSL_FLAG(bool, paced, false,
          "after the warm-up print \"ready\", then time one run per line read from stdin and "
          "print its ms, until EOF (--repeats then counts only --gemm_bound's): "
          "bench/compare_reference.py's runs in turns with the reference");
ABSL_FLAG(bool, worker_thread, false,
          "run the steps on a second thread, as the server's batcher does (not the main thread "
          "that set the intra-op thread count)");
ABSL_FLAG(bool, gemm_bound, false,
          "also record the GEMM calls (LibTorch's mm, addmm, bmm, baddbmm; the Linears' and "
          "SwiGLU pieces' brgemm and sgemm) of one step, on every thread, and time them alone in "
          "this run (same threads, operands of the same sizes, strides and dtype), and beside "
          "them the attention's products over its allowed pairs as LibTorch's bmm "
          "(bench::AttentionProducts): the issue's bound for a GEMM-bound cell is step <= 1.15 x "
          "the time of the GEMMs it must do");
ABSL_FLAG(std::string, profile, "",
          "also write a chrome trace of one more run here (LibTorch's profiler; summarise it with "
          "bench/profile_summary.py)");

namespace praxis::model {
namespace {

// The step file of --inputs, or synthetic inputs of --layout (as praxis-load sends).
absl::StatusOr<StepInputs> Inputs(const BackboneConfig& config) {
  if (!absl::GetFlag(FLAGS_inputs).empty() || absl::GetFlag(FLAGS_layout).empty()) {
    return wire::ReadStepInputs(absl::GetFlag(FLAGS_inputs), 0);
  }
  PRAXIS_ASSIGN_OR_RETURN(wire::StepGeometry g,
                          wire::ParseLayout(absl::GetFlag(FLAGS_layout), "--layout"));
  return wire::SyntheticInputs(config.step_dims(), g, absl::GetFlag(FLAGS_rows), /*seed=*/0);
}

absl::Status Run() {
  ModelSource source;
  source.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  source.config_path = absl::GetFlag(FLAGS_config);
  source.dtype = absl::GetFlag(FLAGS_dtype);
  BackboneOptions options;
  PRAXIS_ASSIGN_OR_RETURN(options.attention,
                          ParseAttention(absl::GetFlag(FLAGS_attention), "--attention"));
  options.text_cache_entries = absl::GetFlag(FLAGS_text_cache_entries);
  PRAXIS_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(source, options));
  BackboneStepRunner runner(std::move(loaded.model));
  PRAXIS_ASSIGN_OR_RETURN(StepInputs in, Inputs(runner.config()));
  PRAXIS_RETURN_IF_ERROR(ValidateStep(runner.config(), in));  // the runner does not check
  const auto all =
      OutputSelection::All(static_cast<int>(runner.config().encoder.tap_blocks.size()));
  PRAXIS_RETURN_IF_ERROR(runner.Run(in, all).status());  // warm-up: builds the layout's masks
  std::vector<double> times;
  const auto timed_run = [&]() -> absl::Status {
    const auto start = std::chrono::steady_clock::now();
    PRAXIS_RETURN_IF_ERROR(runner.Run(in, all).status());
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    return absl::OkStatus();
  };
  if (absl::GetFlag(FLAGS_paced)) {
    std::cout << "ready" << std::endl;
    for (std::string line; std::getline(std::cin, line);) {
      PRAXIS_RETURN_IF_ERROR(timed_run());
      std::cout << times.back() << std::endl;
    }
    if (times.empty()) return absl::InvalidArgumentError("--paced: no line read, no run timed");
  } else {
    for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) PRAXIS_RETURN_IF_ERROR(timed_run());
  }
  if (!absl::GetFlag(FLAGS_profile).empty()) {
    torch::autograd::profiler::RecordProfile trace(absl::GetFlag(FLAGS_profile));
    PRAXIS_RETURN_IF_ERROR(runner.Run(in, all).status());
  }
  std::string gemms;
  if (absl::GetFlag(FLAGS_gemm_bound)) {
    absl::Status s;
    const std::vector<bench::GemmCall> calls =
        bench::RecordGemms([&] { s = runner.Run(in, all).status(); });
    PRAXIS_RETURN_IF_ERROR(s);
    double gflop = 0;
    for (const bench::GemmCall& c : calls) gflop += c.Flops() / 1e9;
    const int64_t rows = in.noised.size(0);
    const StepCost cost = ComputeStepCost(runner.config(), StepLayout(in), in.decode, rows);
    // In the dtype the step's products ran in (a bf16 model's may run in float32).
    const std::vector<bench::GemmCall> attention = bench::AttentionProducts(
        runner.config(), StepLayout(in), in.decode, rows,
        calls.empty() ? torch::kFloat32 : std::get<2>(calls.front().operands.front()));
    double attention_gflop = 0;
    for (const bench::GemmCall& c : attention) attention_gflop += c.Flops() / 1e9;
    const int repeats = absl::GetFlag(FLAGS_repeats);
    gemms = absl::StrCat(", \"gemm_ms\": ", bench::TimeGemmsMs(calls, repeats),
                         ", \"gemm_calls\": ", calls.size(), ", \"gemm_gflop\": ", gflop,
                         ", \"attention_products_ms\": ", bench::TimeGemmsMs(attention, repeats),
                         ", \"attention_products_calls\": ", attention.size(),
                         ", \"attention_products_gflop\": ", attention_gflop,
                         ", \"useful_gflop\": ", cost.gflop());
  }
  std::cout << "{\"times_ms\": [" << absl::StrJoin(times, ", ")
            << "], \"median_ms\": " << bench::Median(times) << gemms << "}" << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace praxis::model

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_repeats) < 1) {
    std::cerr << "--repeats: expected at least 1\n";
    return 2;
  }
  torch::set_num_threads(absl::GetFlag(FLAGS_threads));
  absl::Status s;
  if (absl::GetFlag(FLAGS_worker_thread)) {
    std::thread([&] { s = praxis::model::Run(); }).join();
  } else {
    s = praxis::model::Run();
  }
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
