#include "bench/gemm_record.h"

#include <ATen/Parallel.h>  // at::in_parallel_region
#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string_view>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "bench/stats.h"
#include "model/cpu_kernels.h"

namespace praxis::bench {
namespace {

absl::Mutex mu;
std::vector<GemmCall>* recording ABSL_GUARDED_BY(mu) = nullptr;

std::unique_ptr<at::ObserverContext> OnOpStart(const at::RecordFunction& fn) {
  const std::string_view name = fn.name();
  const int operands = name == "aten::mm" || name == "aten::bmm"             ? 2
                       : name == "aten::addmm" || name == "aten::baddbmm"    ? 3
                       : name == "praxis::sgemm" || name == "praxis::brgemm" ? 2
                                                                             : 0;
  if (operands == 0 || static_cast<int>(fn.inputs().size()) < operands) return nullptr;
  GemmCall call{std::string(name), {}, at::in_parallel_region()};
  for (int i = 0; i < operands; ++i) {
    if (!fn.inputs()[i].isTensor()) return nullptr;  // not a form the replay knows
    const at::Tensor& t = fn.inputs()[i].toTensor();
    call.operands.emplace_back(t.sizes().vec(), t.strides().vec(), t.scalar_type());
  }
  absl::MutexLock lock(&mu);
  if (recording != nullptr) recording->push_back(std::move(call));
  return nullptr;
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

}  // namespace

double GemmCall::Flops() const {
  const auto& a = std::get<0>(operands[operands.size() - 2]);
  const auto& b = std::get<0>(operands.back());
  const double batch = a.size() == 3 ? static_cast<double>(a[0]) : 1.0;
  return 2.0 * batch * static_cast<double>(a[a.size() - 2]) * static_cast<double>(a.back()) *
         static_cast<double>(b.back());
}

std::vector<GemmCall> RecordGemms(const std::function<void()>& run) {
  std::vector<GemmCall> calls;
  {
    absl::MutexLock lock(&mu);
    recording = &calls;
  }
  const at::CallbackHandle handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&OnOpStart).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  {
    // Also when `run` throws: the callback must not outlive `calls`.
    const absl::Cleanup stop = [handle] {
      at::removeCallback(handle);
      absl::MutexLock lock(&mu);
      recording = nullptr;
    };
    run();
  }
  return calls;
}

std::vector<GemmCall> AttentionProducts(const model::BackboneConfig& c, model::WindowLayout layout,
                                        bool decode, int64_t rows, c10::ScalarType dtype) {
  layout.registers = c.num_registers;
  std::vector<std::pair<model::MaskKey, int64_t>> towers = {
      {model::EncoderMaskKey(layout, c.flex_block_size), c.encoder.depth}};
  if (decode) {
    towers.emplace_back(model::DecoderMaskKey(layout, c.ph(), c.pw(), c.flex_block_size),
                        c.decoder.depth);
  }
  const int64_t batch = rows * c.num_kv_heads, g = c.num_heads / c.num_kv_heads;
  const int64_t hd = c.head_dim();
  auto bmm = [&](int64_t m, int64_t k, int64_t n) {
    auto operand = [&](int64_t r, int64_t cols) {
      return GemmCall::Operand{{batch, r, cols}, {r * cols, cols, 1}, dtype};
    };
    return GemmCall{"aten::bmm", {operand(m, k), operand(k, n)}};
  };
  std::vector<GemmCall> calls;
  for (const auto& [key, depth] : towers) {
    const model::TokenTags tags = *model::WindowTags(key.slots, key.chunk_size);
    const std::vector<model::AllowedBlock> blocks =
        model::AllowedBlocks(model::ChunkCausalRule(tags), tags, tags);
    for (int64_t i = 0; i < depth; ++i) {
      for (const model::AllowedBlock& b : blocks) {
        const int64_t nq = g * (b.q_end - b.q_begin), nk = b.kv_end - b.kv_begin;
        calls.push_back(bmm(nq, hd, nk));
        calls.push_back(bmm(nq, nk, hd));
      }
    }
  }
  return calls;
}

double TimeGemmsMs(const std::vector<GemmCall>& calls, int repeats) {
  std::map<GemmCall::Operand, torch::Tensor> made;
  std::vector<std::vector<torch::Tensor>> args;
  for (const GemmCall& c : calls) {
    std::vector<torch::Tensor>& a = args.emplace_back();
    for (const GemmCall::Operand& o : c.operands) {
      auto it = made.find(o);
      if (it == made.end()) it = made.emplace(o, MakeOperand(o)).first;
      a.push_back(it->second);
    }
  }
  auto run_one = [&](size_t i) {
    const std::string& op = calls[i].op;
    const std::vector<torch::Tensor>& a = args[i];
    // The pieces' products as LibTorch's GEMM of the same operands: BLAS's sgemm is the one under
    // LibTorch's float matmul; brgemm's bf16 pieces replay on oneDNN's full matmul, whose per-call
    // cost (~15-20 us) is above brgemm's, so a bf16 step's GEMM time reads somewhat high.
    if (op == "aten::mm" || op == "praxis::sgemm" || op == "praxis::brgemm") {
      torch::mm(a[0], a[1]);
    } else if (op == "aten::bmm") {
      torch::bmm(a[0], a[1]);
    } else if (op == "aten::addmm") {
      torch::addmm(a[0], a[1], a[2]);
    } else {
      torch::baddbmm(a[0], a[1], a[2]);
    }
  };
  auto run_all = [&] {
    for (size_t i = 0; i < calls.size();) {
      size_t end = i + 1;
      if (calls[i].in_parallel_region) {
        while (end < calls.size() && calls[end].in_parallel_region) ++end;
        // One call per thread at a time, as the step's pieces ran (cpu::RunTasks).
        model::cpu::RunTasks(static_cast<int64_t>(end - i),
                             [&](int64_t j) { run_one(i + static_cast<size_t>(j)); });
      } else {
        run_one(i);
      }
      i = end;
    }
  };
  run_all();
  std::vector<double> times;
  for (int i = 0; i < std::max(repeats, 1); ++i) {
    const auto start = std::chrono::steady_clock::now();
    run_all();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return Median(times);
}

}  // namespace praxis::bench
