#pragma once

// The checkpoint tests' fixture: a temporary checkpoint directory with the tiny config and random
// weights, and helpers to read, write and compare. Header-only; needs PRAXIS_SOURCE_DIR.

#include <ftw.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/file_util.h"
#include "model/checkpoint.h"
#include "wire/safetensors.h"

namespace praxis::model {

using wire::LoadMode;
using wire::SafetensorsFile;
using wire::WriteSafetensors;

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// (POSIX, not std::filesystem: see common/file_util.h.)
inline std::string ReadFile(const std::string& path) { return ReadFileToString(path).value_or(""); }

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

inline void RemoveTree(const std::string& dir) {
  nftw(
      dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
}

inline int64_t FileSize(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

inline std::string TinyConfigText() {
  return ReadFile(std::string(PRAXIS_SOURCE_DIR) + "/configs/tiny.json");
}

// tiny.json with backbone.dtype replaced.
inline std::string TinyConfigWithDtype(const std::string& dtype) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(TinyConfigText());
  j["backbone"]["dtype"] = dtype;
  return j.dump(2);
}

// One random tensor per expected parameter, with its spec's shape and dtype.
inline Named RandomTensors(const BackboneConfig& config, uint64_t seed) {
  torch::Generator gen = at::detail::createCPUGenerator(seed);
  Named out;
  for (const auto& [name, spec] : ExpectedParameters(config)) {
    out.emplace_back(name, torch::randn(spec.shape, gen).to(spec.dtype));
  }
  return out;
}

// A checkpoint directory per test: config.json and model.safetensors written from `tensors`.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = JoinPath(testing::TempDir(), "checkpoint_test_XXXXXX");
    ASSERT_NE(mkdtemp(templ.data()), nullptr) << templ;
    dir_ = templ;
    UseConfig(TinyConfigText());
  }
  void TearDown() override { RemoveTree(dir_); }

  void UseConfig(const std::string& text) {
    config_text_ = text;
    config_ = *ParseConfig(text);
    tensors = RandomTensors(config_, 7);
  }
  void Write() {
    WriteFile(JoinPath(dir_, "config.json"), config_text_);
    ASSERT_TRUE(WriteSafetensors(weights(), tensors, {{"format", "pt"}}).ok());
  }
  absl::StatusOr<Checkpoint> Load(const CheckpointOptions& options = {}) {
    return LoadCheckpoint(dir_, options);
  }
  // Writes, loads, expects InvalidArgument and returns its message.
  std::string LoadError() {
    Write();
    absl::StatusOr<Checkpoint> c = Load();
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    return std::string(c.status().message());
  }
  torch::Tensor& Find(const std::string& name) {
    auto it = std::find_if(tensors.begin(), tensors.end(),
                           [&](const auto& p) { return p.first == name; });
    EXPECT_NE(it, tensors.end()) << name;
    return it->second;
  }
  void Remove(const std::string& name) {
    std::erase_if(tensors, [&](const auto& p) { return p.first == name; });
  }
  std::string weights() const { return JoinPath(dir_, "model.safetensors"); }

  std::string dir_;
  std::string config_text_;
  BackboneConfig config_;
  Named tensors;
};

inline void ExpectSameValues(const Checkpoint& c, const Named& written,
                             torch::ScalarType param_dtype) {
  ASSERT_EQ(c.tensors.size(), written.size());
  for (const auto& [name, t] : written) {
    ASSERT_TRUE(c.tensors.count(name)) << name;
    const torch::ScalarType want = IsFloat32Parameter(name) ? torch::kFloat32 : param_dtype;
    const torch::Tensor& got = c.tensors.at(name);
    EXPECT_EQ(got.scalar_type(), want) << name;
    EXPECT_TRUE(torch::equal(got, t.to(want))) << name;
  }
}

}  // namespace praxis::model
