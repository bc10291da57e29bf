#include "model/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "model/config_bounds.h"
#include "tests/model/promptly.h"

namespace praxis::model {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

std::string RepoConfig(const std::string& name) {
  return std::string(PRAXIS_SOURCE_DIR) + "/configs/" + name;
}

Json TinyJson() {
  std::ifstream in(RepoConfig("tiny.json"));
  std::stringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

// The error message of parsing `j`, or "" if it parsed.
std::string ErrorOf(const Json& j) {
  absl::StatusOr<BackboneConfig> c = ParseConfig(j.dump());
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  return std::string(c.status().message());
}

TEST(ConfigTest, ParsesTiny) {
  absl::StatusOr<BackboneConfig> c = LoadConfig(RepoConfig("tiny.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dim, 64);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim(), 16);
  EXPECT_EQ(c->timestep_dim, 32);
  EXPECT_EQ(c->num_registers, 4);
  EXPECT_EQ(c->text_dim, 48);
  EXPECT_EQ(c->param_dtype(), torch::kFloat32);
  EXPECT_EQ(c->flex_block_size, 32);
  EXPECT_EQ(c->moe.num_experts, 4);
  EXPECT_EQ(c->moe.top_k, 2);
  EXPECT_EQ(c->moe.expert_dim, 32);
  EXPECT_EQ(c->moe.shared_dim, 64);
  EXPECT_EQ(c->encoder.depth, 3);
  EXPECT_EQ(c->encoder.moe_blocks, std::vector<int64_t>({1}));
  EXPECT_EQ(c->encoder.tap_blocks, std::vector<int64_t>({0, 2}));
  EXPECT_EQ(c->encoder.video_in_c_in, 16);
  EXPECT_EQ(c->encoder.text_in_c_in, 48);
  EXPECT_TRUE(c->encoder.is_moe(1));
  EXPECT_FALSE(c->encoder.is_moe(0));
  EXPECT_EQ(c->decoder.depth, 2);
  EXPECT_EQ(c->decoder.unpatch_factor, std::vector<int64_t>({1, 2, 2}));
  EXPECT_EQ(c->ph(), 2);
  EXPECT_EQ(c->pw(), 2);
  EXPECT_EQ(c->decoder.video_in_c_in, 4);
  EXPECT_EQ(c->decoder.video_out_c_out, 4);
  EXPECT_EQ(c->latent_channels(), 16);
}

TEST(ConfigTest, EveryRepositoryConfigLoads) {
  for (const char* name : {"tiny.json", "bench.json", "praxis-1.json", "praxis-1-reduced.json"}) {
    absl::StatusOr<BackboneConfig> c = LoadConfig(RepoConfig(name));
    EXPECT_TRUE(c.ok()) << name << ": " << c.status();
  }
  absl::StatusOr<BackboneConfig> bench = LoadConfig(RepoConfig("bench.json"));
  ASSERT_TRUE(bench.ok());
  EXPECT_EQ(bench->param_dtype(), torch::kBFloat16);
}

// The GPU check's model (issue 14): Praxis-1's widths, experts and heads, 4 blocks per tower.
TEST(ConfigTest, Praxis1ReducedIsPraxis1WithFourBlocksPerTower) {
  std::ifstream full_in(RepoConfig("praxis-1.json"));
  std::ifstream reduced_in(RepoConfig("praxis-1-reduced.json"));
  Json full = Json::parse(full_in), reduced = Json::parse(reduced_in);
  for (const char* tower : {"encoder", "decoder"}) {
    EXPECT_EQ(reduced["backbone"][tower]["depth"], 4) << tower;
    EXPECT_EQ(reduced["backbone"][tower]["moe_blocks"], Json::parse("[1, 2, 3]")) << tower;
    for (const char* key : {"depth", "moe_blocks"}) {
      full["backbone"][tower][key] = reduced["backbone"][tower][key];
    }
  }
  EXPECT_EQ(reduced["backbone"]["encoder"]["tap_blocks"], Json::parse("[0, 1, 2, 3]"));
  full["backbone"]["encoder"]["tap_blocks"] = reduced["backbone"]["encoder"]["tap_blocks"];
  EXPECT_EQ(reduced, full) << "only depths, MoE blocks and taps differ from praxis-1.json";
  absl::StatusOr<BackboneConfig> c = LoadConfig(RepoConfig("praxis-1-reduced.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->dim, 2048);
  EXPECT_EQ(c->num_heads, 16);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->moe.num_experts, 64);
  EXPECT_EQ(c->moe.top_k, 4);
}

TEST(ConfigTest, LoadConfigAcceptsADirectory) {
  // (POSIX, not std::filesystem: see common/file_util.h.)
  std::string dir = testing::TempDir() + "/config_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string file = dir + "/config.json";
  std::ofstream(file) << TinyJson().dump();
  absl::StatusOr<BackboneConfig> c = LoadConfig(dir);
  EXPECT_TRUE(c.ok()) << c.status();
  ::unlink(file.c_str());
  ::rmdir(dir.c_str());
}

TEST(ConfigTest, MissingFileIsNotFound) {
  absl::StatusOr<BackboneConfig> c = LoadConfig("/nonexistent/praxis/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("/nonexistent/praxis/config.json"));
}

TEST(ConfigTest, OmittedAssumedKeysTakeTheirDefaults) {
  Json j = TinyJson();
  for (const char* key : {"rope_theta", "qk_norm", "norm_eps", "gelu_approximate", "routed_scale",
                          "text_position_offset", "decoder_frame_block_offset", "clean_timestep",
                          "modulation_dtype", "attention"}) {
    j["backbone"].erase(key);
  }
  absl::StatusOr<BackboneConfig> c = ParseConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->norm_eps, 1e-6);
  EXPECT_EQ(c->gelu_approximate, "tanh");
  EXPECT_EQ(c->routed_scale, 1.0);
  EXPECT_EQ(c->text_position_offset, 1);
  EXPECT_EQ(c->decoder_frame_block_offset, 2);
  EXPECT_EQ(c->clean_timestep, 0.0);
  EXPECT_EQ(c->modulation_dtype, "float32");
  EXPECT_EQ(c->flex_block_size, 128);
  j["backbone"]["attention"] = Json::object();
  EXPECT_EQ(ErrorOf(j), "");
}

TEST(ConfigTest, OtherTopLevelSectionsAreIgnored) {
  Json j = TinyJson();
  j["text_encoder"] = {{"anything", 1}};
  EXPECT_EQ(ErrorOf(j), "");
}

TEST(ConfigTest, IntegerAcceptedWhereANumberIsExpected) {
  Json j = TinyJson();
  j["backbone"]["rope_theta"] = 500;
  absl::StatusOr<BackboneConfig> c = ParseConfig(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 500.0);
}

TEST(ConfigTest, MissingBackboneSectionOrBadJson) {
  EXPECT_EQ(ErrorOf(Json{{"other", 1}}), "config: missing top-level 'backbone' section");
  EXPECT_EQ(ErrorOf(Json::array()), "config: missing top-level 'backbone' section");
  EXPECT_EQ(ErrorOf(Json{{"backbone", Json::array()}}), "backbone: expected an object, got list");
  absl::StatusOr<BackboneConfig> c = ParseConfig("{\"backbone\": {");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("invalid JSON"));
}

TEST(ConfigTest, UnknownKeyNamesItsPath) {
  Json j = TinyJson();
  j["backbone"]["moe"]["foo"] = 1;
  EXPECT_EQ(ErrorOf(j), "backbone.moe: unknown key 'foo'");
  j = TinyJson();
  j["backbone"]["dims"] = 64;
  EXPECT_EQ(ErrorOf(j), "backbone: unknown key 'dims'");
  j = TinyJson();
  j["backbone"]["encoder"]["video_in"]["c_out"] = 4;
  EXPECT_EQ(ErrorOf(j), "backbone.encoder.video_in: unknown key 'c_out'");
  j = TinyJson();
  j["backbone"]["encoder"]["unpatch_factor"] = {1, 2, 2};  // a decoder key
  EXPECT_EQ(ErrorOf(j), "backbone.encoder: unknown key 'unpatch_factor'");
}

TEST(ConfigTest, MissingKeyNamesItsPath) {
  Json j = TinyJson();
  j["backbone"]["encoder"].erase("depth");
  EXPECT_EQ(ErrorOf(j), "backbone.encoder.depth: missing required key");
  j = TinyJson();
  j["backbone"].erase("dtype");
  EXPECT_EQ(ErrorOf(j), "backbone.dtype: missing required key");
  j = TinyJson();
  j["backbone"]["decoder"]["video_out"].erase("c_out");
  EXPECT_EQ(ErrorOf(j), "backbone.decoder.video_out.c_out: missing required key");
  j = TinyJson();
  j["backbone"].erase("moe");
  EXPECT_EQ(ErrorOf(j), "backbone.moe: missing required key");
}

TEST(ConfigTest, UnknownKeyIsReportedBeforeAMissingOne) {
  Json j = TinyJson();
  j["backbone"].erase("dim");
  j["backbone"]["foo"] = 1;
  EXPECT_EQ(ErrorOf(j), "backbone: unknown key 'foo'");
}

TEST(ConfigTest, WrongTypeNamesItsPathAndValue) {
  const std::pair<Json::json_pointer, Json> cases[] = {
      {Json::json_pointer("/backbone/encoder/depth"), "x"},
      {Json::json_pointer("/backbone/encoder/depth"), 3.0},
      {Json::json_pointer("/backbone/encoder/depth"), true},
      {Json::json_pointer("/backbone/qk_norm"), 1},
      {Json::json_pointer("/backbone/norm_eps"), "1e-6"},
      {Json::json_pointer("/backbone/dtype"), 32},
      {Json::json_pointer("/backbone/decoder/moe_blocks"), Json::array({1, "2"})},
      {Json::json_pointer("/backbone/moe"), Json::array()},
  };
  const char* want[] = {
      "backbone.encoder.depth: expected an integer, got \"x\"",
      "backbone.encoder.depth: expected an integer, got 3.0",
      "backbone.encoder.depth: expected an integer, got true",
      "backbone.qk_norm: expected true or false, got 1",
      "backbone.norm_eps: expected a number, got \"1e-6\"",
      "backbone.dtype: expected a string, got 32",
      "backbone.decoder.moe_blocks: expected a list of integers, got [1,\"2\"]",
      "backbone.moe: expected an object, got list",
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    Json j = TinyJson();
    j[cases[i].first] = cases[i].second;
    EXPECT_EQ(ErrorOf(j), want[i]);
  }
}

TEST(ConfigTest, InconsistentValuesAreRejected) {
  const std::pair<Json::json_pointer, Json> cases[] = {
      {Json::json_pointer("/backbone/encoder/text_in/c_in"), 32},
      {Json::json_pointer("/backbone/moe/top_k"), 5},
      {Json::json_pointer("/backbone/encoder/moe_blocks"), Json::array({3})},
      {Json::json_pointer("/backbone/decoder/moe_blocks"), Json::array({1, 1})},
      {Json::json_pointer("/backbone/encoder/tap_blocks"), Json::array({-1})},
      {Json::json_pointer("/backbone/decoder/unpatch_factor"), Json::array({2, 2, 2})},
      {Json::json_pointer("/backbone/decoder/unpatch_factor"), Json::array({1, 2})},
      {Json::json_pointer("/backbone/decoder/video_in/c_in"), 8},
      {Json::json_pointer("/backbone/num_kv_heads"), 3},
      {Json::json_pointer("/backbone/dim"), 60},
      {Json::json_pointer("/backbone/dtype"), "float64"},
      {Json::json_pointer("/backbone/gelu_approximate"), "erf"},
      {Json::json_pointer("/backbone/attention/flex_block_size"), 0},
  };
  const char* want[] = {
      "backbone: encoder.text_in.c_in must equal text_dim",
      "backbone: moe: need 0 < top_k <= num_experts",
      "backbone: encoder.moe_blocks out of range",
      "backbone: decoder.moe_blocks has duplicates",
      "backbone: encoder.tap_blocks out of range",
      "backbone: decoder.unpatch_factor[0] (time) must be 1",
      "backbone: decoder.unpatch_factor must have 3 entries",
      "backbone: decoder.video_in.c_in must equal encoder.video_in.c_in / (ph * pw)",
      "backbone: num_heads must be divisible by num_kv_heads",
      "backbone: head_dim = dim / num_heads must be even",
      "backbone: dtype must be one of ('float32', 'bfloat16', 'float16')",
      "backbone: gelu_approximate must be one of ('tanh', 'none')",
      "backbone: attention.flex_block_size must be positive",
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    Json j = TinyJson();
    j[cases[i].first] = cases[i].second;
    EXPECT_EQ(ErrorOf(j), want[i]) << cases[i].first.to_string();
  }
}

TEST(ConfigTest, UnpatchFactorProductThatWrapsIsRefusedNotASigfpe) {
  // 2^32 * 2^32 wraps to 0 in int64, and `c_in % 0` used to kill the process with SIGFPE.
  Json j = TinyJson();
  j["backbone"]["decoder"]["unpatch_factor"] = {1, int64_t{1} << 32, int64_t{1} << 32};
  EXPECT_EQ(ErrorOf(j),
            "backbone.decoder.unpatch_factor: expected non-negative sizes whose product is at "
            "most 131072, got [1, 4294967296, 4294967296]");
  j["backbone"]["decoder"]["unpatch_factor"] = {1, int64_t{1} << 62, 4};
  EXPECT_THAT(ErrorOf(j), HasSubstr("backbone.decoder.unpatch_factor: "));
}

TEST(ConfigTest, SizesBeyondTheirBoundsNameTheirKey) {
  const std::pair<Json::json_pointer, Json> cases[] = {
      {Json::json_pointer("/backbone/dim"), int64_t{1} << 40},
      {Json::json_pointer("/backbone/timestep_dim"), int64_t{1} << 18},
      {Json::json_pointer("/backbone/encoder/ffn_dim"), int64_t{1} << 62},
      {Json::json_pointer("/backbone/moe/expert_dim"), 200000},
      {Json::json_pointer("/backbone/decoder/depth"), 5000},
      {Json::json_pointer("/backbone/num_registers"), 1 << 20},
      {Json::json_pointer("/backbone/attention/flex_block_size"), 1 << 16},
      {Json::json_pointer("/backbone/text_position_offset"), INT64_MIN},
      {Json::json_pointer("/backbone/decoder_frame_block_offset"), INT64_MAX},
  };
  const char* want[] = {
      "backbone.dim: 1099511627776 exceeds the limit of 131072",
      "backbone.timestep_dim: 262144 exceeds the limit of 131072",
      "backbone.encoder.ffn_dim: 4611686018427387904 exceeds the limit of 131072",
      "backbone.moe.expert_dim: 200000 exceeds the limit of 131072",
      "backbone.decoder.depth: 5000 exceeds the limit of 1024",
      "backbone.num_registers: 1048576 exceeds the limit of 4096",
      "backbone.attention.flex_block_size: 65536 exceeds the limit of 1024",
      "backbone.text_position_offset: -9223372036854775808 is beyond +-1048576",
      "backbone.decoder_frame_block_offset: 9223372036854775807 is beyond +-1048576",
  };
  for (size_t i = 0; i < std::size(cases); ++i) {
    Json j = TinyJson();
    j[cases[i].first] = cases[i].second;
    EXPECT_EQ(ErrorOf(j), want[i]) << cases[i].first.to_string();
  }
  Json experts = TinyJson();  // top_k <= num_experts holds, so the bound is what refuses it
  experts["backbone"]["moe"]["num_experts"] = 10000;
  EXPECT_EQ(ErrorOf(experts), "backbone.moe.num_experts: 10000 exceeds the limit of 4096");
}

TEST(ConfigTest, TotalParameterCountIsBounded) {
  // Every size within its own bound, but together ~2^46 parameters: refused before any allocation.
  Json j = TinyJson();
  j["backbone"]["dim"] = 131072;
  j["backbone"]["encoder"]["depth"] = 1024;
  j["backbone"]["encoder"]["ffn_dim"] = 131072;
  absl::StatusOr<BackboneConfig> c = ParseConfig(j.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("parameters exceed the limit of 274877906944"));
  EXPECT_EQ(c.status().message().substr(0, 10), "backbone: ");
}

TEST(ConfigTest, ParameterCountOfTheRepositoryConfigs) {
  EXPECT_EQ(*ParameterCount(*LoadConfig(RepoConfig("tiny.json"))), 272512);  // docs/model.md
  absl::StatusOr<int64_t> praxis1 = ParameterCount(*LoadConfig(RepoConfig("praxis-1.json")));
  ASSERT_TRUE(praxis1.ok()) << praxis1.status();
  EXPECT_GT(*praxis1, int64_t{10'000'000'000});
  EXPECT_LT(*praxis1, kMaxParameters / 8);
}

TEST(ConfigTest, DeeplyNestedJsonIsRefusedWithoutRecursing) {
  // Parsing this into an ordered_json, or dump()ing it, recursed 200,000 deep: a stack overflow.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  Json j = TinyJson();
  std::string text = j.dump();
  const std::string key = "\"dim\":64";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "\"dim\":" + deep);
  EXPECT_EQ(ParseConfig(text).status().message(), "config: JSON nested deeper than 64 levels");
  // Brackets inside strings are text, and a nested value within the limit is named, not dumped.
  j["backbone"]["dtype"] = std::string(100, '[');
  EXPECT_EQ(ErrorOf(j), "backbone: dtype must be one of ('float32', 'bfloat16', 'float16')");
  j = TinyJson();
  j["backbone"]["dim"] = Json::array({Json::array({1})});
  EXPECT_EQ(ErrorOf(j), "backbone.dim: expected an integer, got a nested list");
}

TEST(ConfigTest, FifoIsRefusedPromptly) {
  std::string dir = testing::TempDir() + "/config_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string fifo = dir + "/config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const absl::Status s = RunPromptly([&] { return LoadConfig(dir).status(); }, fifo);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), fifo + ": not a regular file (a FIFO)");
  ::unlink(fifo.c_str());
  ::rmdir(dir.c_str());
}

TEST(ConfigTest, ParseDtype) {
  EXPECT_EQ(*ParseDtype("float32"), torch::kFloat32);
  EXPECT_EQ(*ParseDtype("bfloat16"), torch::kBFloat16);
  EXPECT_EQ(*ParseDtype("float16"), torch::kFloat16);
  EXPECT_EQ(ParseDtype("fp32").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace praxis::model
