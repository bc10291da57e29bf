// docs/model.md's "Checkpoint parameter names" table against the one table in the code
// (model/param_names.h): the same names, the same dtype class and the same shapes, so that a name
// changed on either side alone fails here.

#include "model/param_names.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"

namespace praxis::model {
namespace {

constexpr char kSection[] = "## Checkpoint parameter names";
constexpr char kMiddleDot[] = "\xc2\xb7";  // "·" in "2·dim"

// One name of the doc's table with its symbolic shape ("2·dim, timestep_dim") and dtype class.
struct DocParam {
  std::string shape;
  bool float32 = false;
};

// The text between the backticks of `cell`, in order.
std::vector<std::string> Backticked(absl::string_view cell) {
  std::vector<std::string> parts = absl::StrSplit(cell, '`');
  std::vector<std::string> out;
  for (size_t i = 1; i < parts.size(); i += 2) out.push_back(parts[i]);
  return out;
}

// The doc writes `t_proj.VideoTensor.weight`, `.bias` and `...in_proj.q_weight`, `k_weight`: a
// name without a dot, or starting with one, replaces the last component of the name before it.
std::vector<std::string> ExpandNames(const std::vector<std::string>& written) {
  std::vector<std::string> out;
  for (const std::string& w : written) {
    const bool relative = !out.empty() && (!absl::StrContains(w, '.') || w.front() == '.');
    if (!relative) {
      out.push_back(w);
      continue;
    }
    const std::string& prev = out.back();
    out.push_back(prev.substr(0, prev.rfind('.') + 1) + std::string(absl::StripPrefix(w, ".")));
  }
  return out;
}

// The bracketed shapes of `cell` ("[2·dim, timestep_dim], [2·dim]"), brackets dropped.
std::vector<std::string> Shapes(absl::string_view cell) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(cell, '[', absl::SkipEmpty())) {
    const size_t end = part.find(']');
    if (end != absl::string_view::npos) out.emplace_back(part.substr(0, end));
  }
  return out;
}

// The rows of docs/model.md's parameter table, by name pattern ("blocks.{i}.norm1.weight").
std::map<std::string, DocParam> DocTable() {
  const std::string path = std::string(PRAXIS_SOURCE_DIR) + "/docs/model.md";
  absl::StatusOr<std::string> text = ReadFileToString(path);
  EXPECT_TRUE(text.ok()) << text.status();
  std::map<std::string, DocParam> out;
  if (!text.ok()) return out;
  const size_t start = text->find(kSection);
  EXPECT_NE(start, std::string::npos) << path << " has no '" << kSection << "'";
  if (start == std::string::npos) return out;
  bool in_table = false;
  for (absl::string_view line : absl::StrSplit(absl::string_view(*text).substr(start), '\n')) {
    if (!absl::StartsWith(line, "|")) {
      if (in_table) break;  // the table's end
      continue;
    }
    in_table = true;
    const std::vector<std::string> cells = absl::StrSplit(line, '|');
    if (cells.size() != 6 || absl::StartsWith(cells[1], "---") ||
        absl::StrContains(cells[2], "name (after tower prefix)")) {
      continue;  // the header and its rule
    }
    const std::vector<std::string> names = ExpandNames(Backticked(cells[2]));
    const std::vector<std::string> shapes = Shapes(cells[3]);
    EXPECT_TRUE(shapes.size() == 1 || shapes.size() == names.size()) << line;
    for (size_t i = 0; i < names.size() && !shapes.empty(); ++i) {
      const bool f32 = absl::StripAsciiWhitespace(cells[4]) == "float32";
      const bool fresh =
          out.emplace(names[i], DocParam{shapes[shapes.size() == 1 ? 0 : i], f32}).second;
      EXPECT_TRUE(fresh) << names[i] << " is listed twice";
    }
  }
  return out;
}

// A valid config whose sizes are all different, so that a shape naming the wrong size fails.
BackboneConfig DistinctConfig() {
  absl::StatusOr<BackboneConfig> c = ParseConfig(R"({"backbone": {
    "dim": 48, "num_heads": 6, "num_kv_heads": 2, "timestep_dim": 10, "num_registers": 5,
    "text_dim": 7, "rope_theta": 10000.0, "qk_norm": true, "norm_eps": 1e-6,
    "gelu_approximate": "tanh", "routed_scale": 1.0, "text_position_offset": 1,
    "decoder_frame_block_offset": 2, "clean_timestep": 0.0, "dtype": "float32",
    "modulation_dtype": "float32", "attention": {"flex_block_size": 32},
    "moe": {"num_experts": 9, "top_k": 2, "expert_dim": 11, "shared_dim": 13},
    "encoder": {"depth": 2, "ffn_dim": 17, "moe_blocks": [1], "tap_blocks": [0, 1],
                "video_in": {"c_in": 12}, "text_in": {"c_in": 7}},
    "decoder": {"depth": 2, "ffn_dim": 19, "moe_blocks": [1], "unpatch_factor": [1, 2, 2],
                "video_in": {"c_in": 3}, "video_out": {"c_out": 3}}}})");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// The doc's symbolic shape ("2·dim, timestep_dim") evaluated for one tower; -1 for a size whose
// symbol is unknown (so that the comparison fails and names it).
std::vector<int64_t> Evaluate(const std::string& shape, const BackboneConfig& c,
                              const TowerConfig& t) {
  const std::map<std::string, int64_t> symbols = {{"R", c.num_registers},
                                                  {"dim", c.dim},
                                                  {"timestep_dim", c.timestep_dim},
                                                  {"c_in", t.video_in_c_in},
                                                  {"text_dim", c.text_dim},
                                                  {"c_out", t.video_out_c_out},
                                                  {"H", c.num_heads},
                                                  {"hd", c.head_dim()},
                                                  {"KVH", c.num_kv_heads},
                                                  {"ffn_dim", t.ffn_dim},
                                                  {"E", c.moe.num_experts},
                                                  {"expert_dim", c.moe.expert_dim},
                                                  {"shared_dim", c.moe.shared_dim}};
  std::vector<int64_t> out;
  for (absl::string_view size : absl::StrSplit(shape, ',')) {
    int64_t value = 1;
    for (absl::string_view factor : absl::StrSplit(size, kMiddleDot)) {
      factor = absl::StripAsciiWhitespace(factor);
      int64_t n = 0;
      auto it = symbols.find(std::string(factor));
      value *= absl::SimpleAtoi(factor, &n) ? n : (it == symbols.end() ? -1 : it->second);
    }
    out.push_back(value);
  }
  return out;
}

std::set<std::string> TablePatterns() {
  std::set<std::string> out;
  for (const ParamRow& row : ParamTable()) out.insert(ParamPattern(row));
  return out;
}

TEST(ParamNamesTest, DocListsExactlyTheTableNames) {
  std::set<std::string> doc;
  for (const auto& [name, param] : DocTable()) doc.insert(name);
  const std::set<std::string> table = TablePatterns();
  std::vector<std::string> only_doc, only_table;
  for (const std::string& n : doc) {
    if (!table.count(n)) only_doc.push_back(n);
  }
  for (const std::string& n : table) {
    if (!doc.count(n)) only_table.push_back(n);
  }
  EXPECT_THAT(only_doc, ::testing::IsEmpty())
      << "in docs/model.md but not in model/param_names.cc: " << absl::StrJoin(only_doc, ", ");
  EXPECT_THAT(only_table, ::testing::IsEmpty())
      << "in model/param_names.cc but not in docs/model.md: " << absl::StrJoin(only_table, ", ");
  EXPECT_EQ(table.size(), ParamTable().size()) << "two rows share a name";
}

TEST(ParamNamesTest, DocDtypesAndShapesMatchTheTable) {
  const std::map<std::string, DocParam> doc = DocTable();
  const BackboneConfig c = DistinctConfig();
  for (const ParamRow& row : ParamTable()) {
    const std::string pattern = ParamPattern(row);
    auto it = doc.find(pattern);
    if (it == doc.end()) continue;  // DocListsExactlyTheTableNames reports it
    EXPECT_EQ(it->second.float32, row.float32) << pattern;
    const bool encoder =
        row.scope != ParamScope::kDecoder && row.scope != ParamScope::kDecoderBlock;
    const bool decoder = row.scope != ParamScope::kEncoder;
    for (const TowerConfig* t : {encoder ? &c.encoder : nullptr, decoder ? &c.decoder : nullptr}) {
      if (t == nullptr) continue;
      EXPECT_EQ(Evaluate(it->second.shape, c, *t), row.shape(c, *t))
          << pattern << " in the " << (t == &c.encoder ? "encoder" : "decoder") << ": doc says ["
          << it->second.shape << "]";
    }
  }
}

TEST(ParamNamesTest, ListParametersNamesEachParameterOnceWithItsTowerAndBlock) {
  const BackboneConfig c = DistinctConfig();
  std::set<std::string> names;
  for (const NamedParam& p : ListParameters(c)) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
  }
  EXPECT_TRUE(names.count("backbone.encoder.blocks.0.ffn.0.linear.a_weight"));
  EXPECT_TRUE(names.count("backbone.encoder.blocks.1.ffn.expert_bias"));
  EXPECT_FALSE(names.count("backbone.encoder.blocks.1.ffn.0.linear.a_weight"));
  EXPECT_TRUE(names.count("backbone.decoder.blocks.1.modulation.weight"));
  EXPECT_FALSE(names.count("backbone.encoder.blocks.0.modulation.weight"));
  EXPECT_TRUE(names.count("backbone.encoder.input_projections.TextEncodingTensor.proj.3.weight"));
  EXPECT_FALSE(names.count("backbone.decoder.input_projections.TextEncodingTensor.proj.3.weight"));
  EXPECT_EQ(BlockParamName(TowerKind::kDecoder, 1, ParamId::kNorm2),
            "backbone.decoder.blocks.1.norm2.weight");
  EXPECT_EQ(ParamName(TowerKind::kEncoder, ParamId::kTimeFreqs),
            "backbone.encoder.t_embedding.freqs");
}

TEST(ParamNamesTest, QkNormRowsOnlyWithQkNorm) {
  BackboneConfig c = DistinctConfig();
  const size_t with = ListParameters(c).size();
  c.qk_norm = false;
  std::set<std::string> names;
  for (const NamedParam& p : ListParameters(c)) names.insert(p.name);
  EXPECT_FALSE(names.count("backbone.encoder.blocks.0.mha.q_norm.weight"));
  // q_norm and k_norm of every block of both towers.
  EXPECT_EQ(with - names.size(), 2u * (c.encoder.depth + c.decoder.depth));
}

// docs/model.md: tiny.json has 272,512 parameters.
TEST(ParamNamesTest, TinyConfigHasTheDocumentedParameterCount) {
  absl::StatusOr<BackboneConfig> c =
      LoadConfig(std::string(PRAXIS_SOURCE_DIR) + "/configs/tiny.json");
  ASSERT_TRUE(c.ok()) << c.status();
  int64_t total = 0;
  for (const NamedParam& p : ListParameters(*c)) {
    int64_t n = 1;
    for (int64_t s : p.shape) n *= s;
    total += n;
  }
  EXPECT_EQ(total, 272512);
}

}  // namespace
}  // namespace praxis::model
