// praxis-masks: prints the BlockMask (and optionally the dense mask) of a layout as JSON, so that
// the C++ masks can be compared with PyTorch flex attention's create_block_mask.

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/usage.h"
#include "model/masks.h"

ABSL_FLAG(std::string, tower, "",
          "encoder | decoder: use the tower layout given by the flags below");
ABSL_FLAG(int64_t, registers, 4, "register tokens");
ABSL_FLAG(int64_t, anchor_h, 0, "anchor grid rows (encoder)");
ABSL_FLAG(int64_t, anchor_w, 0, "anchor grid columns (encoder)");
ABSL_FLAG(int64_t, text_len, 0, "text tokens (encoder)");
ABSL_FLAG(int64_t, k, 1, "chunks in the window");
ABSL_FLAG(int64_t, f, 1, "latent frames per chunk");
ABSL_FLAG(int64_t, h, 1, "latent grid rows the encoder sees");
ABSL_FLAG(int64_t, w, 1, "latent grid columns the encoder sees");
ABSL_FLAG(int64_t, ph, 1, "decoder unpatch factor, rows");
ABSL_FLAG(int64_t, pw, 1, "decoder unpatch factor, columns");
ABSL_FLAG(std::string, slots, "",
          "explicit layout instead of --tower: kind:frames:tokens_per_frame,... (kind 0 global, "
          "1 noised, 2 clean)");
ABSL_FLAG(int64_t, chunk_size, 1, "frames per chunk of --slots");
ABSL_FLAG(std::string, rule, "chunk_causal", "chunk_causal | expert_self | expert_cross (--slots)");
ABSL_FLAG(int64_t, window, 0, "expert_cross: clean frames a query may look back");
ABSL_FLAG(int64_t, q_chunks, 1, "expert rules: query chunks");
ABSL_FLAG(int64_t, q_tokens_per_chunk, 1, "expert rules: query tokens per chunk");
ABSL_FLAG(int64_t, block_size, praxis::model::kDefaultBlockSize, "tile edge");
ABSL_FLAG(bool, dense, false, "also print the dense mask, one '0'/'1' string per query row");
ABSL_FLAG(bool, stdin_jsonl, false,
          "read one request per line from stdin (a JSON object whose keys are these flag names, "
          "slots as [[kind, frames, tokens_per_frame], ...]) and answer one JSON line each");

namespace praxis::model {
namespace {

using nlohmann::json;

// One request, in flag or JSON form.
struct Request {
  std::string tower;
  WindowLayout layout;
  int64_t ph = 1, pw = 1;
  std::vector<Slot> slots;
  int64_t chunk_size = 1;
  std::string rule = "chunk_causal";
  int64_t window = 0, q_chunks = 1, q_tokens_per_chunk = 1;
  int64_t block_size = kDefaultBlockSize;
  bool dense = false;
};

absl::StatusOr<std::vector<Slot>> ParseSlots(const std::string& text) {
  std::vector<Slot> slots;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(part, ':');
    Slot s;
    int64_t kind = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &kind) || !absl::SimpleAtoi(f[1], &s.frames) ||
        !absl::SimpleAtoi(f[2], &s.tokens_per_frame)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slots: expected kind:frames:tokens_per_frame, got '", part, "'"));
    }
    s.kind = static_cast<int32_t>(kind);
    slots.push_back(s);
  }
  return slots;
}

Request FromFlags() {
  Request r;
  r.tower = absl::GetFlag(FLAGS_tower);
  r.layout = {absl::GetFlag(FLAGS_registers), absl::GetFlag(FLAGS_anchor_h),
              absl::GetFlag(FLAGS_anchor_w),  absl::GetFlag(FLAGS_text_len),
              absl::GetFlag(FLAGS_k),         absl::GetFlag(FLAGS_f),
              absl::GetFlag(FLAGS_h),         absl::GetFlag(FLAGS_w)};
  r.ph = absl::GetFlag(FLAGS_ph);
  r.pw = absl::GetFlag(FLAGS_pw);
  r.chunk_size = absl::GetFlag(FLAGS_chunk_size);
  r.rule = absl::GetFlag(FLAGS_rule);
  r.window = absl::GetFlag(FLAGS_window);
  r.q_chunks = absl::GetFlag(FLAGS_q_chunks);
  r.q_tokens_per_chunk = absl::GetFlag(FLAGS_q_tokens_per_chunk);
  r.block_size = absl::GetFlag(FLAGS_block_size);
  r.dense = absl::GetFlag(FLAGS_dense);
  return r;
}

absl::StatusOr<Request> FromJson(const std::string& line) {
  const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("request is not a JSON object");
  Request r;
  try {
    r.tower = j.value("tower", "");
    r.layout = {j.value("registers", int64_t{4}), j.value("anchor_h", int64_t{0}),
                j.value("anchor_w", int64_t{0}),  j.value("text_len", int64_t{0}),
                j.value("k", int64_t{1}),         j.value("f", int64_t{1}),
                j.value("h", int64_t{1}),         j.value("w", int64_t{1})};
    r.ph = j.value("ph", int64_t{1});
    r.pw = j.value("pw", int64_t{1});
    for (const json& s : j.value("slots", json::array())) {
      r.slots.push_back({s.at(0).get<int32_t>(), s.at(1).get<int64_t>(), s.at(2).get<int64_t>()});
    }
    r.chunk_size = j.value("chunk_size", int64_t{1});
    r.rule = j.value("rule", "chunk_causal");
    r.window = j.value("window", int64_t{0});
    r.q_chunks = j.value("q_chunks", int64_t{1});
    r.q_tokens_per_chunk = j.value("q_tokens_per_chunk", int64_t{1});
    r.block_size = j.value("block_size", kDefaultBlockSize);
    r.dense = j.value("dense", false);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad request field: ", e.what()));
  }
  return r;
}

// The rule and grid a request describes.
struct Problem {
  MaskRule rule;
  TokenTags q_tags;
  TokenTags kv_tags;
};

absl::StatusOr<Problem> Resolve(const Request& r) {
  if (!r.tower.empty()) {
    if (r.tower != "encoder" && r.tower != "decoder") {
      return absl::InvalidArgumentError(
          absl::StrCat("tower must be encoder or decoder, got '", r.tower, "'"));
    }
    const MaskKey key = r.tower == "encoder" ? EncoderMaskKey(r.layout, r.block_size)
                                             : DecoderMaskKey(r.layout, r.ph, r.pw, r.block_size);
    PRAXIS_ASSIGN_OR_RETURN(TokenTags tags, WindowTags(key.slots, key.chunk_size));
    return Problem{ChunkCausalRule(tags), tags, tags};
  }
  PRAXIS_ASSIGN_OR_RETURN(TokenTags kv_tags, WindowTags(r.slots, r.chunk_size));
  if (r.rule == "chunk_causal") return Problem{ChunkCausalRule(kv_tags), kv_tags, kv_tags};
  if (r.q_chunks < 1 || r.q_tokens_per_chunk < 1) {
    return absl::InvalidArgumentError("q_chunks and q_tokens_per_chunk must be >= 1");
  }
  TokenTags q_tags = ExpertQueryTags(r.q_chunks, r.q_tokens_per_chunk, r.chunk_size);
  if (r.rule == "expert_self") return Problem{ExpertSelfRule(q_tags), q_tags, q_tags};
  if (r.rule == "expert_cross") {
    return Problem{ExpertCrossRule(q_tags, kv_tags, r.window), q_tags, kv_tags};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("rule must be chunk_causal, expert_self or expert_cross, got '", r.rule, "'"));
}

json TensorJson(const torch::Tensor& t) {
  const torch::Tensor c = t.to(torch::kInt64).contiguous();
  if (c.dim() == 1)
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  json rows = json::array();
  for (int64_t i = 0; i < c.size(0); ++i) rows.push_back(TensorJson(c[i]));
  return rows;
}

absl::StatusOr<json> Answer(const Request& r) {
  PRAXIS_ASSIGN_OR_RETURN(Problem p, Resolve(r));
  PRAXIS_ASSIGN_OR_RETURN(BlockMask m, BuildBlockMask(p.rule, p.q_tags, p.kv_tags, r.block_size));
  json out = {{"q_len", m.q_len},
              {"kv_len", m.kv_len},
              {"block_size", m.block_size},
              {"kv_num_blocks", TensorJson(m.kv_num_blocks)},
              {"kv_indices", TensorJson(m.kv_indices)},
              {"full_kv_num_blocks", TensorJson(m.full_kv_num_blocks)},
              {"full_kv_indices", TensorJson(m.full_kv_indices)}};
  if (r.dense) {
    const torch::Tensor d =
        DenseMask(p.rule, p.q_tags.length(), p.kv_tags.length()).to(torch::kUInt8).contiguous();
    json rows = json::array();
    for (int64_t i = 0; i < d.size(0); ++i) {
      std::string row(d.size(1), '0');
      const uint8_t* src = d[i].data_ptr<uint8_t>();
      for (int64_t j = 0; j < d.size(1); ++j) row[j] = src[j] ? '1' : '0';
      rows.push_back(std::move(row));
    }
    out["dense"] = std::move(rows);
  }
  return out;
}

json AnswerOrError(const absl::StatusOr<Request>& r) {
  absl::StatusOr<json> out = r.ok() ? Answer(*r) : absl::StatusOr<json>(r.status());
  if (!out.ok()) return json{{"error", std::string(out.status().message())}};
  return *std::move(out);
}

int Main() {
  if (!absl::GetFlag(FLAGS_stdin_jsonl)) {
    absl::StatusOr<Request> r = FromFlags();
    if (r.ok() && !absl::GetFlag(FLAGS_slots).empty()) {
      absl::StatusOr<std::vector<Slot>> slots = ParseSlots(absl::GetFlag(FLAGS_slots));
      if (!slots.ok())
        r = slots.status();
      else
        r->slots = *std::move(slots);
    }
    if (r.ok() && r->tower.empty() && r->slots.empty()) {
      r = absl::InvalidArgumentError("give --tower or --slots (see --help)");
    }
    const json out = AnswerOrError(r);
    std::cout << out.dump() << "\n";
    return out.contains("error") ? 2 : 0;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::cout << AnswerOrError(FromJson(line)).dump() << std::endl;
  }
  return 0;
}

}  // namespace
}  // namespace praxis::model

int main(int argc, char** argv) {
  praxis::SetUsage(
      "Prints the BlockMask of a tower layout (--tower) or of explicit slots and a rule (--slots) "
      "as JSON.");
  absl::ParseCommandLine(argc, argv);
  return praxis::model::Main();
}
