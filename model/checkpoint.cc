#include "model/checkpoint.h"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "model/checksums.h"
#include "model/param_names.h"

namespace praxis::model {
namespace {

std::string ShapeString(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

constexpr char kConfigFile[] = "config.json";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";
// An index names each tensor once; a few MiB even for tens of thousands of tensors.
constexpr int64_t kMaxIndexBytes = int64_t{16} << 20;

// The shard file names of an index's weight_map, checked to be plain names inside the directory.
absl::StatusOr<std::map<std::string, std::string>> ReadIndex(const std::string& path) {
  PRAXIS_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(path, kMaxIndexBytes));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": missing 'weight_map' object"));
  }
  std::map<std::string, std::string> shard_of;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().empty() ||
        absl::StrContains(file.get<std::string>(), "/") || file.get<std::string>() == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": weight_map['", name, "'] must be a file name in the checkpoint directory"));
    }
    shard_of[name] = file.get<std::string>();
  }
  return shard_of;
}

// The opened files of `dir` and, for every tensor name, the file that holds it.
struct OpenedFiles {
  std::vector<std::shared_ptr<const wire::SafetensorsFile>> files;
  std::map<std::string, const wire::SafetensorsFile*> file_of;
};

absl::Status AddFile(std::shared_ptr<const wire::SafetensorsFile> file, OpenedFiles* out) {
  for (const std::string& name : file->names()) {
    auto [it, inserted] = out->file_of.emplace(name, file.get());
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is in both ",
                                                     it->second->path(), " and ", file->path()));
    }
  }
  out->files.push_back(std::move(file));
  return absl::OkStatus();
}

absl::StatusOr<OpenedFiles> OpenFiles(const std::string& dir, wire::LoadMode mode) {
  const std::string index = JoinPath(dir, kIndexFile);
  const std::string single = JoinPath(dir, kSingleFile);
  OpenedFiles out;
  if (!PathExists(index)) {
    if (!PathExists(single)) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", dir, ": neither ", kSingleFile, " nor ", kIndexFile));
    }
    PRAXIS_ASSIGN_OR_RETURN(std::shared_ptr<const wire::SafetensorsFile> file,
                            wire::SafetensorsFile::Open(single, mode));
    PRAXIS_RETURN_IF_ERROR(AddFile(std::move(file), &out));
    return out;
  }
  PRAXIS_ASSIGN_OR_RETURN(auto shard_of, ReadIndex(index));
  std::set<std::string> shards;
  for (const auto& [name, shard] : shard_of) shards.insert(shard);
  for (const std::string& shard : shards) {
    PRAXIS_ASSIGN_OR_RETURN(std::shared_ptr<const wire::SafetensorsFile> file,
                            wire::SafetensorsFile::Open(JoinPath(dir, shard), mode));
    PRAXIS_RETURN_IF_ERROR(AddFile(std::move(file), &out));
  }
  for (const auto& [name, shard] : shard_of) {
    auto it = out.file_of.find(name);
    if (it == out.file_of.end() || Basename(it->second->path()) != shard) {
      return absl::InvalidArgumentError(absl::StrCat(index, ": weight_map puts tensor '", name,
                                                     "' in ", shard, ", which does not hold it"));
    }
  }
  return out;
}

// With a SHA256SUMS (`verified`), every file the load read must be one it verified: a list that
// leaves out the weights would check nothing that matters.
absl::Status CheckVerified(const std::string& dir,
                           const std::map<std::string, std::string>& verified,
                           const OpenedFiles& files) {
  std::vector<std::string> read = {kConfigFile};
  if (PathExists(JoinPath(dir, kIndexFile))) read.push_back(kIndexFile);
  for (const auto& file : files.files) read.push_back(Basename(file->path()));
  for (const std::string& name : read) {
    if (!verified.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(JoinPath(dir, name), ": not listed in ",
                                                     kChecksumFile, ", which lists ",
                                                     verified.size(), " files"));
    }
  }
  return absl::OkStatus();
}

// The config of `dir`, and the text it was parsed from; errors prefixed with the file.
absl::StatusOr<std::pair<BackboneConfig, std::string>> ReadConfig(const std::string& dir) {
  const std::string path = JoinPath(dir, kConfigFile);
  PRAXIS_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path, kMaxConfigBytes));
  absl::StatusOr<BackboneConfig> config = ParseConfig(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return std::pair(*std::move(config), std::move(text));
}

// The strict name, shape and dtype checks, on the headers alone, in the reference's order.
absl::Status CheckTensors(const BackboneConfig& config, const ParamSpecs& expected,
                          const OpenedFiles& files) {
  std::set<std::string> known;
  for (const auto& [name, spec] : expected) known.insert(name);
  for (const auto& [name, file] : files.file_of) {  // sorted by name
    if (absl::StartsWith(name, kBackbonePrefix) && !known.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected tensor '", name, "' (in ", file->path(), ")"));
    }
  }
  for (const auto& [name, spec] : expected) {
    auto it = files.file_of.find(name);
    if (it == files.file_of.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor '", name, "'"));
    }
    const wire::TensorInfo& got = *it->second->info(name);
    if (got.shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape ",
                                                     ShapeString(got.shape), ", expected ",
                                                     ShapeString(spec.shape)));
    }
    if (got.dtype != spec.dtype) {
      const std::string why = IsFloat32Parameter(name)
                                  ? "always float32"
                                  : absl::StrCat("config.json dtype is ", config.dtype);
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has dtype ",
                                                     DtypeName(got.dtype), ", expected ",
                                                     DtypeName(spec.dtype), " (", why, ")"));
    }
  }
  return absl::OkStatus();
}

// Logs, once, how many names outside `backbone.` were skipped and the first one's prefix.
void LogIgnored(const std::string& dir, const std::vector<std::string>& ignored) {
  if (ignored.empty()) return;
  const std::string& first = ignored.front();
  const size_t dot = first.find('.');
  const std::string prefix = dot == std::string::npos ? first : first.substr(0, dot + 1);
  std::fprintf(stderr, "praxis: checkpoint %s: ignored %zu tensors outside '%s' (first: '%s')\n",
               dir.c_str(), ignored.size(), kBackbonePrefix, prefix.c_str());
}

// Views of the expected tensors, converted (dtype, device) where options ask for it.
absl::StatusOr<std::unordered_map<std::string, torch::Tensor>> Materialize(
    const ParamSpecs& expected, const OpenedFiles& files, const CheckpointOptions& options) {
  std::unordered_map<std::string, torch::Tensor> out;
  out.reserve(expected.size());
  for (const auto& [name, spec] : expected) {
    PRAXIS_ASSIGN_OR_RETURN(torch::Tensor t, files.file_of.at(name)->Get(name));
    const torch::ScalarType want =
        IsFloat32Parameter(name) ? torch::kFloat32 : options.dtype.value_or(spec.dtype);
    if (want != t.scalar_type() || options.device != t.device()) t = t.to(options.device, want);
    out.emplace(name, std::move(t));
  }
  return out;
}

absl::StatusOr<Checkpoint> Load(const std::string& dir, const CheckpointOptions& options) {
  if (options.dtype.has_value() && *options.dtype != torch::kFloat32 &&
      *options.dtype != torch::kBFloat16 && *options.dtype != torch::kFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("CheckpointOptions.dtype must be float32, bfloat16 or float16, got ",
                     DtypeName(*options.dtype)));
  }
  PRAXIS_ASSIGN_OR_RETURN(const auto verified, VerifyChecksums(dir));
  Checkpoint ckpt;
  PRAXIS_ASSIGN_OR_RETURN(std::tie(ckpt.config, ckpt.config_json), ReadConfig(dir));
  PRAXIS_ASSIGN_OR_RETURN(OpenedFiles files, OpenFiles(dir, options.load));
  if (verified) PRAXIS_RETURN_IF_ERROR(CheckVerified(dir, *verified, files));
  const ParamSpecs expected = ExpectedParameters(ckpt.config);
  absl::Status checked = CheckTensors(ckpt.config, expected, files);
  if (!checked.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", dir, ": ", checked.message()));
  }
  for (const auto& [name, file] : files.file_of) {
    if (!absl::StartsWith(name, kBackbonePrefix)) ckpt.ignored.push_back(name);
  }
  LogIgnored(dir, ckpt.ignored);
  PRAXIS_ASSIGN_OR_RETURN(ckpt.tensors, Materialize(expected, files, options));
  if (options.dtype.has_value()) ckpt.config.dtype = DtypeName(*options.dtype);
  if (options.load == wire::LoadMode::kMmap && options.device.is_cpu()) {
    ckpt.files = std::move(files.files);
  }
  return ckpt;
}

}  // namespace

ParamSpecs ExpectedParameters(const BackboneConfig& config) {
  ParamSpecs out;
  for (NamedParam& p : ListParameters(config)) {
    out.push_back(
        {std::move(p.name),
         ParamSpec{std::move(p.shape), p.float32 ? torch::kFloat32 : config.param_dtype()}});
  }
  return out;
}

bool IsFloat32Parameter(const std::string& name) {
  for (const ParamRow& row : ParamTable()) {
    if (row.float32 && absl::EndsWith(name, row.name)) return true;
  }
  return false;
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir,
                                          const CheckpointOptions& options) {
  try {
    return Load(dir, options);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("checkpoint ", dir, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("checkpoint ", dir, ": ", e.what()));
  }
}

}  // namespace praxis::model
