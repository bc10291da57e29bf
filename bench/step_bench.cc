// step_bench: times the server's StepRunner on one step file, for bench/compare_reference.py to put
// beside the PyTorch reference's forward on the same checkpoint, inputs and thread count, or on
// synthetic inputs of a layout, for bench/served_ratio.py to put beside the served step.
// Prints one JSON line: {"times_ms": [...], "median_ms": m} (with --gemm_bound also "gemm_ms",
// "gemm_calls", "gemm_gflop"). Not a test: nothing is asserted.

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
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
ABSL_FLAG(std::string, dtype, "", "parameter dtype to convert to at load (default: the file's)");
ABSL_FLAG(std::string, inputs, "", "step file (text, anchor, [clean], noised, timesteps, ...)");
ABSL_FLAG(std::string, layout, "",
          "without --inputs: synthetic inputs of this layout (text_len,h,w,K,F; praxis-load's "
          "--mix form), --rows rows");
ABSL_FLAG(int64_t, rows, 1, "rows of the synthetic inputs (--layout)");
ABSL_FLAG(int32_t, threads, 2, "LibTorch intra-op threads");
ABSL_FLAG(int32_t, repeats, 5, "timed runs (after one untimed warm-up run)");
ABSL_FLAG(bool, worker_thread, false,
          "run the steps on a second thread, as the server's batcher does (not the main thread "
          "that set the intra-op thread count)");
ABSL_FLAG(bool, gemm_bound, false,
          "also record the LibTorch GEMM calls (mm, addmm, bmm, baddbmm) of one step, on every "
          "thread, and time them alone in this run (same threads, operands of the same sizes, "
          "strides and dtype): the issue's bound for a GEMM-bound cell is step <= 1.15 x that");
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

// One LibTorch GEMM call of a step: its op and its tensor operands' sizes, strides and dtype (the
// output of an out= variant left out: the replay makes its own).
struct GemmCall {
  using Operand = std::tuple<std::vector<int64_t>, std::vector<int64_t>, c10::ScalarType>;
  std::string op;
  std::vector<Operand> operands;
};

// The calls RecordGemm collects while `gemm_calls` is set (from every thread: the MoE's pieces run
// their matmuls on the intra-op threads).
absl::Mutex gemm_mu;
std::vector<GemmCall>* gemm_calls ABSL_GUARDED_BY(gemm_mu) = nullptr;

std::unique_ptr<at::ObserverContext> RecordGemm(const at::RecordFunction& fn) {
  const std::string_view name = fn.name();
  const int operands = name == "aten::mm" || name == "aten::bmm"          ? 2
                       : name == "aten::addmm" || name == "aten::baddbmm" ? 3
                                                                          : 0;
  if (operands == 0) return nullptr;
  GemmCall call{std::string(name), {}};
  for (int i = 0; i < operands && i < static_cast<int>(fn.inputs().size()); ++i) {
    const at::Tensor& t = fn.inputs()[i].toTensor();
    call.operands.emplace_back(t.sizes().vec(), t.strides().vec(), t.scalar_type());
  }
  absl::MutexLock lock(&gemm_mu);
  if (gemm_calls != nullptr) gemm_calls->push_back(std::move(call));
  return nullptr;
}

// The GEMM calls of one run of `step`.
std::vector<GemmCall> RecordGemms(const std::function<absl::Status()>& step, absl::Status* s) {
  std::vector<GemmCall> calls;
  {
    absl::MutexLock lock(&gemm_mu);
    gemm_calls = &calls;
  }
  const at::CallbackHandle handle = at::addGlobalCallback(at::RecordFunctionCallback(&RecordGemm)
                                                              .needsInputs(true)
                                                              .scopes({at::RecordScope::FUNCTION}));
  *s = step();
  at::removeCallback(handle);
  absl::MutexLock lock(&gemm_mu);
  gemm_calls = nullptr;
  return calls;
}

// Random values laid out as `operand` (a broadcast bias's zero strides kept).
torch::Tensor MakeOperand(const GemmCall::Operand& operand) {
  const auto& [sizes, strides, dtype] = operand;
  int64_t extent = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return torch::empty(sizes, dtype);
    extent += (sizes[d] - 1) * strides[d];
  }
  return torch::randn({extent}, torch::TensorOptions().dtype(dtype)).as_strided(sizes, strides);
}

struct GemmTime {
  double median_ms = 0;
  double gflop = 0;
};

// The calls run alone, in order, `repeats` times after one warm-up: the median of their total.
// Operands of equal layout are one tensor, as a step's weights are: no cache misses it would not
// have had (so the bound errs on the GEMMs' side).
GemmTime TimeGemms(const std::vector<GemmCall>& calls, int repeats) {
  std::map<GemmCall::Operand, torch::Tensor> made;
  std::vector<std::vector<torch::Tensor>> args;
  GemmTime g;
  for (const GemmCall& c : calls) {
    std::vector<torch::Tensor>& a = args.emplace_back();
    for (const GemmCall::Operand& o : c.operands) {
      auto it = made.find(o);
      if (it == made.end()) it = made.emplace(o, MakeOperand(o)).first;
      a.push_back(it->second);
    }
    const torch::Tensor& x = a[a.size() - 2];
    const torch::Tensor& w = a.back();
    const int64_t batch = x.dim() == 3 ? x.size(0) : 1;
    g.gflop += 2.0 * batch * x.size(-2) * x.size(-1) * w.size(-1) / 1e9;
  }
  auto run_all = [&] {
    for (size_t i = 0; i < calls.size(); ++i) {
      const std::string& op = calls[i].op;
      const std::vector<torch::Tensor>& a = args[i];
      if (op == "aten::mm") {
        torch::mm(a[0], a[1]);
      } else if (op == "aten::bmm") {
        torch::bmm(a[0], a[1]);
      } else if (op == "aten::addmm") {
        torch::addmm(a[0], a[1], a[2]);
      } else {
        torch::baddbmm(a[0], a[1], a[2]);
      }
    }
  };
  run_all();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run_all();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  g.median_ms = times[times.size() / 2];
  return g;
}

absl::Status Run() {
  ModelSource source;
  source.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  source.config_path = absl::GetFlag(FLAGS_config);
  source.dtype = absl::GetFlag(FLAGS_dtype);
  PRAXIS_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModel(source, {}));
  BackboneStepRunner runner(std::move(loaded.model));
  PRAXIS_ASSIGN_OR_RETURN(StepInputs in, Inputs(runner.config()));
  PRAXIS_RETURN_IF_ERROR(ValidateStep(runner.config(), in));  // the runner does not check
  const auto all =
      OutputSelection::All(static_cast<int>(runner.config().encoder.tap_blocks.size()));
  PRAXIS_RETURN_IF_ERROR(runner.Run(in, all).status());  // warm-up: builds the layout's masks
  std::vector<double> times;
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    const auto start = std::chrono::steady_clock::now();
    PRAXIS_RETURN_IF_ERROR(runner.Run(in, all).status());
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  if (!absl::GetFlag(FLAGS_profile).empty()) {
    torch::autograd::profiler::RecordProfile trace(absl::GetFlag(FLAGS_profile));
    PRAXIS_RETURN_IF_ERROR(runner.Run(in, all).status());
  }
  std::string gemms;
  if (absl::GetFlag(FLAGS_gemm_bound)) {
    absl::Status s;
    const std::vector<GemmCall> calls =
        RecordGemms([&] { return runner.Run(in, all).status(); }, &s);
    PRAXIS_RETURN_IF_ERROR(s);
    const GemmTime g = TimeGemms(calls, absl::GetFlag(FLAGS_repeats));
    const StepCost cost =
        ComputeStepCost(runner.config(), StepLayout(in), in.decode, in.noised.size(0));
    gemms = absl::StrCat(", \"gemm_ms\": ", g.median_ms, ", \"gemm_calls\": ", calls.size(),
                         ", \"gemm_gflop\": ", g.gflop, ", \"useful_gflop\": ", cost.gflop());
  }
  std::vector<double> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  std::cout << "{\"times_ms\": [" << absl::StrJoin(times, ", ")
            << "], \"median_ms\": " << sorted[sorted.size() / 2] << gemms << "}" << std::endl;
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
  praxis::model::KeepFreedMemoryForReuse();  // as praxis-server does
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
