#include "model/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "model/config_bounds.h"
#include "tests/model/checkpoint_fixture.h"
#include "tests/model/promptly.h"
#include "wire/safetensors.h"

namespace praxis::model {
namespace {

using ::testing::HasSubstr;

// `options`, loading by memory-mapping.
CheckpointOptions Mmap(CheckpointOptions options) {
  options.load = LoadMode::kMmap;
  return options;
}

TEST(ExpectedParametersTest, TinyHasTheDocumentedParameters) {
  const BackboneConfig config = *ParseConfig(TinyConfigText());
  const ParamSpecs specs = ExpectedParameters(config);
  int64_t numel = 0;
  for (const auto& [name, spec] : specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    numel += n;
    EXPECT_EQ(spec.dtype, torch::kFloat32) << name;
  }
  EXPECT_EQ(specs.size(), 104u);
  EXPECT_EQ(numel, 272512);  // docs/model.md: "272,512 parameters"
  EXPECT_EQ(specs.front().first, "backbone.encoder.registers");
  EXPECT_EQ(specs.back().first, "backbone.decoder.blocks.1.modulation.bias");
}

TEST(ExpectedParametersTest, ParameterCountIsTheirTotal) {
  for (const char* name : {"tiny.json", "bench.json", "praxis-1.json"}) {
    const BackboneConfig config = *LoadConfig(absl::StrCat(PRAXIS_SOURCE_DIR, "/configs/", name));
    int64_t numel = 0;
    for (const auto& [param, spec] : ExpectedParameters(config)) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      numel += n;
    }
    EXPECT_EQ(ParameterCount(config).value_or(-1), numel) << name;
  }
}

TEST(ExpectedParametersTest, DtypesAndQkNorm) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(TinyConfigWithDtype("bfloat16"));
  j["backbone"]["qk_norm"] = false;
  const BackboneConfig config = *ParseConfig(j.dump());
  const ParamSpecs specs = ExpectedParameters(config);
  EXPECT_EQ(specs.size(), 104u - 2 * 5);  // no q_norm / k_norm in the 5 blocks
  for (const auto& [name, spec] : specs) {
    EXPECT_THAT(name, ::testing::Not(HasSubstr("_norm.")));
    EXPECT_EQ(spec.dtype, IsFloat32Parameter(name) ? torch::kFloat32 : torch::kBFloat16) << name;
  }
  EXPECT_TRUE(IsFloat32Parameter("backbone.encoder.blocks.1.ffn.expert_bias"));
  EXPECT_TRUE(IsFloat32Parameter("backbone.decoder.t_embedding.phases"));
  EXPECT_FALSE(IsFloat32Parameter("backbone.decoder.t_proj.VideoTensor.bias"));
}

TEST_F(CheckpointTest, LoadsWhatItWrote) {
  Write();
  absl::StatusOr<Checkpoint> c = Load();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.dim, 64);
  EXPECT_TRUE(c->ignored.empty());
  ExpectSameValues(*c, tensors, torch::kFloat32);
}

TEST_F(CheckpointTest, ZeroCopyWithoutConversionInMmapMode) {
  Write();
  absl::StatusOr<Checkpoint> c = Load(Mmap({}));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->files.size(), 1u);
  const auto [begin, size] = c->files[0]->mapping();
  for (const auto& [name, t] : c->tensors) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    EXPECT_TRUE(p >= begin && p + t.nbytes() <= begin + size) << name;
  }
  // The views outlive the checkpoint's handles on the file.
  torch::Tensor registers = c->tensors.at("backbone.encoder.registers");
  c = absl::UnknownError("dropped");
  EXPECT_TRUE(torch::equal(registers, Find("backbone.encoder.registers")));
}

TEST_F(CheckpointTest, KeysOutsideBackboneAreIgnored) {
  tensors.emplace_back("vae.decoder.conv.weight", torch::ones({3}));
  tensors.emplace_back("text_encoder.layers.0.w", torch::ones({2, 2}, torch::kBFloat16));
  Write();
  absl::StatusOr<Checkpoint> c = Load();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ignored,
            std::vector<std::string>({"text_encoder.layers.0.w", "vae.decoder.conv.weight"}));
  EXPECT_EQ(c->tensors.size(), ExpectedParameters(config_).size());
  EXPECT_FALSE(c->tensors.count("vae.decoder.conv.weight"));
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
  Remove("backbone.decoder.blocks.1.ffn.routed.down_weight");
  EXPECT_THAT(LoadError(),
              HasSubstr("missing tensor 'backbone.decoder.blocks.1.ffn.routed.down_weight'"));
}

TEST_F(CheckpointTest, UnexpectedTensorInsideBackboneIsNamed) {
  tensors.emplace_back("backbone.encoder.blocks.3.norm1.weight", torch::zeros({64}));
  EXPECT_THAT(LoadError(), HasSubstr("unexpected tensor 'backbone.encoder.blocks.3.norm1.weight'"));
}

TEST_F(CheckpointTest, WrongShapeIsNamedWithExpectedAndGot) {
  Find("backbone.encoder.registers") = torch::zeros({5, 64});
  EXPECT_THAT(LoadError(), HasSubstr("tensor 'backbone.encoder.registers' has shape [5, 64], "
                                     "expected [4, 64]"));
}

TEST_F(CheckpointTest, WrongDtypeIsNamedWithExpectedAndGot) {
  Find("backbone.encoder.blocks.0.mha.gate.weight") =
      Find("backbone.encoder.blocks.0.mha.gate.weight").to(torch::kBFloat16);
  EXPECT_THAT(LoadError(), HasSubstr("tensor 'backbone.encoder.blocks.0.mha.gate.weight' has "
                                     "dtype bfloat16, expected float32"));
  // In a bfloat16 checkpoint the float32 rows stay float32.
  UseConfig(TinyConfigWithDtype("bfloat16"));
  Find("backbone.decoder.blocks.1.ffn.expert_bias") =
      Find("backbone.decoder.blocks.1.ffn.expert_bias").to(torch::kBFloat16);
  EXPECT_THAT(LoadError(), HasSubstr("tensor 'backbone.decoder.blocks.1.ffn.expert_bias' has "
                                     "dtype bfloat16, expected float32 (always float32)"));
}

TEST_F(CheckpointTest, FirstMismatchInExpectedOrderIsReported) {
  Remove("backbone.decoder.registers");  // sorts first, but comes after the encoder
  Find("backbone.encoder.blocks.2.norm1.weight") = torch::zeros({65});
  EXPECT_THAT(LoadError(), HasSubstr("'backbone.encoder.blocks.2.norm1.weight' has shape"));
}

TEST_F(CheckpointTest, TruncatedFileNamesFileAndTensor) {
  Write();
  ASSERT_EQ(::truncate(weights().c_str(), FileSize(weights()) - 100), 0);
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors) names.push_back(name);
  const std::string last = *std::max_element(names.begin(), names.end());  // data is name-sorted
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(weights()));
  EXPECT_THAT(c.status().message(), HasSubstr(absl::StrCat("tensor '", last, "'")));
  EXPECT_THAT(c.status().message(), HasSubstr("(file truncated?)"));
}

TEST_F(CheckpointTest, GarbageHeaderJsonNamesFile) {
  Write();
  const std::string garbage = "{\"backbone.encoder.registers\": {oops";
  const uint64_t n = garbage.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  WriteFile(weights(), bytes + garbage);
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(weights()));
  EXPECT_THAT(c.status().message(), HasSubstr("not valid JSON"));
}

TEST_F(CheckpointTest, HeaderLengthBeyondFileNamesFile) {
  Write();
  std::string bytes = ReadFile(weights());
  const uint64_t n = uint64_t{1} << 40;
  std::memcpy(bytes.data(), &n, 8);
  WriteFile(weights(), bytes);
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(weights()));
  EXPECT_THAT(c.status().message(), HasSubstr("header length 1099511627776 exceeds the file"));
}

TEST_F(CheckpointTest, ShardedIndexLoads) {
  WriteFile(JoinPath(dir_, "config.json"), config_text_);
  tensors.emplace_back("vae.scale", torch::ones({1}));
  Named shards[2];
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string file = absl::StrCat("model-0000", i % 2 + 1, "-of-00002.safetensors");
    shards[i % 2].push_back(tensors[i]);
    map[tensors[i].first] = file;
  }
  for (int s = 0; s < 2; ++s) {
    const std::string file =
        JoinPath(dir_, absl::StrCat("model-0000", s + 1, "-of-00002.safetensors"));
    ASSERT_TRUE(WriteSafetensors(file, shards[s]).ok());
  }
  WriteFile(JoinPath(dir_, "model.safetensors.index.json"),
            nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump());
  absl::StatusOr<Checkpoint> c = Load(Mmap({}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->files.size(), 2u);
  EXPECT_EQ(c->ignored, std::vector<std::string>({"vae.scale"}));
  tensors.pop_back();
  ExpectSameValues(*c, tensors, torch::kFloat32);
}

TEST_F(CheckpointTest, NoWeightsIsNotFound) {
  WriteFile(JoinPath(dir_, "config.json"), config_text_);
  EXPECT_EQ(Load().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, Bfloat16ConvertedToFloat32AtLoad) {
  UseConfig(TinyConfigWithDtype("bfloat16"));
  Write();
  absl::StatusOr<Checkpoint> kept = Load();
  ASSERT_TRUE(kept.ok()) << kept.status();
  ExpectSameValues(*kept, tensors, torch::kBFloat16);
  absl::StatusOr<Checkpoint> c = Load({.dtype = torch::kFloat32});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.dtype, "float32");
  ExpectSameValues(*c, tensors, torch::kFloat32);
}

TEST_F(CheckpointTest, Float32ConvertedToBfloat16AtLoad) {
  Write();
  absl::StatusOr<Checkpoint> c = Load(Mmap({.dtype = torch::kBFloat16}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->config.dtype, "bfloat16");
  EXPECT_EQ(c->config.param_dtype(), torch::kBFloat16);
  ExpectSameValues(*c, tensors, torch::kBFloat16);
  ASSERT_EQ(c->files.size(), 1u);
  EXPECT_FALSE(c->files[0]->IsViewOf(c->tensors.at("backbone.encoder.registers")));
  EXPECT_TRUE(c->files[0]->IsViewOf(c->tensors.at("backbone.encoder.t_embedding.freqs")));
}

TEST_F(CheckpointTest, ConfigErrorsPassThrough) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(TinyConfigText());
  j["backbone"]["moe"]["foo"] = 1;
  config_text_ = j.dump();
  EXPECT_THAT(LoadError(), HasSubstr("backbone.moe: unknown key 'foo'"));
}

// The load is read into memory by default: truncating the file afterwards (as an operator copying
// a new checkpoint over the old one would) must not touch the served tensors. With mmap this test
// dies of SIGBUS.
TEST_F(CheckpointTest, CopyModeSurvivesTruncatingTheFileAfterLoad) {
  Write();
  absl::StatusOr<Checkpoint> c = Load();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->files.empty());
  ASSERT_EQ(::truncate(weights().c_str(), 0), 0);
  ExpectSameValues(*c, tensors, torch::kFloat32);
  EXPECT_EQ(c->config_json, config_text_);
}

TEST_F(CheckpointTest, FifoNamedModelSafetensorsIsRefusedPromptly) {
  WriteFile(JoinPath(dir_, "config.json"), config_text_);
  ASSERT_EQ(::mkfifo(weights().c_str(), 0600), 0);
  const absl::Status s = RunPromptly([&] { return Load().status(); }, weights());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), weights() + ": not a regular file (a FIFO)");
}

TEST_F(CheckpointTest, FifoConfigIsRefusedPromptly) {
  Write();
  const std::string config = JoinPath(dir_, "config.json");
  ::unlink(config.c_str());
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
  const absl::Status s = RunPromptly([&] { return Load().status(); }, config);
  EXPECT_EQ(s.message(), config + ": not a regular file (a FIFO)");
}

TEST_F(CheckpointTest, HostileConfigIsRefusedNamingFileAndKey) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(TinyConfigText());
  j["backbone"]["decoder"]["unpatch_factor"] = {1, int64_t{1} << 32, int64_t{1} << 32};
  WriteFile(JoinPath(dir_, "config.json"), j.dump());
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr(JoinPath(dir_, "config.json") + ": backbone.decoder.unpatch_factor: "));
}

// The header of model.safetensors rewritten so that every tensor starts at byte 0 of the data.
TEST_F(CheckpointTest, AliasedTensorsAreRefused) {
  Write();
  nlohmann::json header = nlohmann::json::object();
  uint64_t longest = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t n = t.nbytes();
    longest = std::max(longest, n);
    header[name] = {{"dtype", "F32"}, {"shape", t.sizes().vec()}, {"data_offsets", {0, n}}};
  }
  const std::string text = header.dump();
  const uint64_t n = text.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  WriteFile(weights(), bytes + text + std::string(longest, '\0'));
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(weights() + ": tensors '"));
  EXPECT_THAT(c.status().message(), HasSubstr("overlap"));
}

TEST_F(CheckpointTest, TrailingBytesAreRefused) {
  Write();
  WriteFile(weights(), ReadFile(weights()) + "hidden payload");
  absl::StatusOr<Checkpoint> c = Load();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr(weights() + ": 14 trailing bytes"));
}

}  // namespace
}  // namespace praxis::model
