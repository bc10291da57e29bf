#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace praxis::model {
namespace {

using Json = nlohmann::json;

struct DtypeCode {
  const char* name;
  torch::ScalarType dtype;
};

constexpr DtypeCode kDtypes[] = {
    {"F64", torch::kFloat64},
    {"F32", torch::kFloat32},
    {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16},
    {"I64", torch::kInt64},
    {"I32", torch::kInt32},
    {"I16", torch::kInt16},
    {"I8", torch::kInt8},
    {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},
    {"F8_E4M3", torch::kFloat8_e4m3fn},
    {"F8_E5M2", torch::kFloat8_e5m2},
};

bool DtypeFromName(const std::string& name, torch::ScalarType* out) {
  for (const DtypeCode& c : kDtypes) {
    if (name == c.name) {
      *out = c.dtype;
      return true;
    }
  }
  return false;
}

bool IsUint(const Json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v >= 0); }

// numel(shape) * element_size, or false on overflow.
bool ByteSize(const std::vector<int64_t>& shape, torch::ScalarType dtype, uint64_t* out) {
  uint64_t n = c10::elementSize(dtype);
  for (int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) return false;
    n *= static_cast<uint64_t>(d);
  }
  *out = n;
  return true;
}

std::string Offsets(const TensorInfo& t) { return absl::StrCat("[", t.begin, ", ", t.end, ")"); }

// One header entry {"dtype", "shape", "data_offsets"}, checked against the data region's size.
absl::StatusOr<TensorInfo> ParseEntry(const Json& v, uint64_t data_bytes) {
  if (!v.is_object()) return absl::InvalidArgumentError("header entry is not an object");
  TensorInfo t;
  auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError("missing or non-string 'dtype'");
  }
  if (!DtypeFromName(dtype->get<std::string>(), &t.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", dtype->dump()));
  }
  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array() ||
      !std::all_of(shape->begin(), shape->end(), IsUint)) {
    return absl::InvalidArgumentError("'shape' must be a list of non-negative integers");
  }
  for (const Json& d : *shape) {
    if (d.get<uint64_t>() > uint64_t{INT64_MAX})
      return absl::InvalidArgumentError("shape overflow");
    t.shape.push_back(d.get<int64_t>());
  }
  auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !IsUint((*offsets)[0]) || !IsUint((*offsets)[1])) {
    return absl::InvalidArgumentError("'data_offsets' must be two non-negative integers");
  }
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  if (t.begin > t.end)
    return absl::InvalidArgumentError(absl::StrCat("data_offsets ", Offsets(t), " are reversed"));
  if (t.end > data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("data_offsets ", Offsets(t), " exceed the ",
                                                   data_bytes,
                                                   "-byte data region (file truncated?)"));
  }
  uint64_t want = 0;
  if (!ByteSize(t.shape, t.dtype, &want) || t.end - t.begin != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_offsets ", Offsets(t), " hold ", t.end - t.begin, " bytes, but dtype ",
        dtype->get<std::string>(), " shape [", absl::StrJoin(t.shape, ", "), "] needs ", want));
  }
  return t;
}

absl::Status ParseMetadata(const Json& v, std::map<std::string, std::string>* out) {
  if (!v.is_object()) return absl::InvalidArgumentError("'__metadata__' is not an object");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'__metadata__' value of '", key, "' is not a string"));
    }
    (*out)[key] = value.get<std::string>();
  }
  return absl::OkStatus();
}

absl::Status InFile(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

// A read-only mapping of a whole file; unmapped when the last tensor view (or the file) lets go.
struct SafetensorsFile::Mapping {
  const uint8_t* data = nullptr;
  size_t size = 0;

  ~Mapping() {
    if (data != nullptr) munmap(const_cast<uint8_t*>(data), size);
  }
};

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", strerror(errno)));
  struct stat st;
  const bool stat_ok = fstat(fd, &st) == 0;
  const uint64_t size = stat_ok ? static_cast<uint64_t>(st.st_size) : 0;
  void* p = size >= 8 ? mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int map_errno = errno;
  close(fd);
  if (!stat_ok || size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, too short for the 8-byte header length"));
  }
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap failed: ", strerror(map_errno)));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->data = static_cast<const uint8_t*>(p);
  mapping->size = size;
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = std::move(mapping);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file->mapping_->data, 8);
  if (header_bytes > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_bytes,
                                                   " exceeds the file (", size, " bytes)"));
  }
  file->data_start_ = 8 + header_bytes;
  const char* text = reinterpret_cast<const char*>(file->mapping_->data + 8);
  const Json header = Json::parse(text, text + header_bytes, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the ", header_bytes, "-byte header is not valid JSON"));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const uint64_t data_bytes = size - file->data_start_;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      PRAXIS_RETURN_IF_ERROR(InFile(path, ParseMetadata(value, &file->metadata_)));
      continue;
    }
    absl::StatusOr<TensorInfo> info = ParseEntry(value, data_bytes);
    if (!info.ok()) return InFile(path, InFile(absl::StrCat("tensor '", name, "'"), info.status()));
    file->entries_.emplace(name, *std::move(info));
  }
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [name, info] : entries_) out.push_back(name);
  return out;
}

const TensorInfo* SafetensorsFile::info(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

absl::StatusOr<torch::Tensor> SafetensorsFile::Get(const std::string& name) const {
  const TensorInfo* t = info(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  uint8_t* p = const_cast<uint8_t*>(mapping_->data + data_start_ + t->begin);
  const auto options = torch::TensorOptions().dtype(t->dtype);
  try {
    // The deleter's copy of the mapping is what keeps the bytes mapped while the view lives.
    torch::Tensor view = torch::from_blob(
        p, t->shape, [keep = mapping_](void*) mutable { keep.reset(); }, options);
    if (reinterpret_cast<uintptr_t>(p) % c10::elementSize(t->dtype) != 0) return view.clone();
    return view;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat(path_, ": tensor '", name, "': ", e.what_without_backtrace()));
  }
}

std::pair<const uint8_t*, size_t> SafetensorsFile::mapping() const {
  return {mapping_->data, mapping_->size};
}

bool SafetensorsFile::IsViewOf(const torch::Tensor& t) const {
  if (!t.defined() || !t.device().is_cpu()) return false;
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return p >= mapping_->data && p + t.nbytes() <= mapping_->data + mapping_->size;
}

absl::StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype) {
  for (const DtypeCode& c : kDtypes) {
    if (c.dtype == dtype) return std::string(c.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors has no code for dtype ", c10::toString(dtype)));
}

namespace {

// The header JSON (padded to 8 bytes) and the blobs of `tensors`, sorted by name.
absl::StatusOr<std::string> BuildHeader(std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                        const std::map<std::string, std::string>& metadata) {
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;  // std::map: keys sorted
  uint64_t offset = 0;
  for (auto& [name, t] : tensors) {
    if (header.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' given twice"));
    }
    PRAXIS_ASSIGN_OR_RETURN(std::string code, SafetensorsDtypeName(t.scalar_type()));
    t = t.detach().to(torch::kCPU).contiguous();
    const uint64_t n = t.nbytes();
    header[name] = {
        {"dtype", code}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump(-1, ' ', /*ensure_ascii=*/true);
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              std::vector<std::pair<std::string, torch::Tensor>> tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::string header;
  try {
    PRAXIS_ASSIGN_OR_RETURN(header, BuildHeader(tensors, metadata));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(path, ": ", e.what_without_backtrace()));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t header_bytes = header.size();
  char length[8];
  std::memcpy(length, &header_bytes, 8);
  out.write(length, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& [name, t] : tensors) {
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot write"));
  return absl::OkStatus();
}

}  // namespace praxis::model
