#include "wire/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace praxis::wire {
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

bool IsUint(const Json& v) { return v.is_number_unsigned() || (v.is_number_integer() && v >= 0); }

std::string Offsets(const TensorInfo& t) { return absl::StrCat("[", t.begin, ", ", t.end, ")"); }

absl::StatusOr<std::vector<int64_t>> ParseShape(const Json& v) {
  const auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array() ||
      !std::all_of(shape->begin(), shape->end(), IsUint)) {
    return absl::InvalidArgumentError("'shape' must be a list of non-negative integers");
  }
  std::vector<int64_t> out;
  for (const Json& d : *shape) {
    if (d.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape dimension ", d.get<uint64_t>(), " is beyond int64"));
    }
    out.push_back(d.get<int64_t>());
  }
  return out;
}

// data_offsets, in range of the `data_bytes`-byte data region and holding exactly dtype x shape.
absl::Status ParseOffsets(const Json& v, uint64_t data_bytes, const std::string& dtype,
                          TensorInfo* t) {
  const auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !IsUint((*offsets)[0]) || !IsUint((*offsets)[1])) {
    return absl::InvalidArgumentError("'data_offsets' must be two non-negative integers");
  }
  t->begin = (*offsets)[0].get<uint64_t>();
  t->end = (*offsets)[1].get<uint64_t>();
  if (t->begin > t->end) {
    return absl::InvalidArgumentError(absl::StrCat("data_offsets ", Offsets(*t), " are reversed"));
  }
  if (t->end > data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("data_offsets ", Offsets(*t), " exceed the ",
                                                   data_bytes,
                                                   "-byte data region (file truncated?)"));
  }
  std::vector<int64_t> factors = t->shape;
  factors.push_back(static_cast<int64_t>(c10::elementSize(t->dtype)));
  const std::optional<int64_t> want = CheckedProduct(factors);
  if (!want || t->end - t->begin != static_cast<uint64_t>(*want)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets ", Offsets(*t), " hold ", t->end - t->begin,
                     " bytes, but dtype ", dtype, " shape [", absl::StrJoin(t->shape, ", "),
                     "] needs ", want ? absl::StrCat(*want) : "more than 2^63"));
  }
  return absl::OkStatus();
}

// One header entry {"dtype", "shape", "data_offsets"}, checked against the data region's size.
absl::StatusOr<TensorInfo> ParseEntry(const Json& v, uint64_t data_bytes) {
  if (!v.is_object()) return absl::InvalidArgumentError("header entry is not an object");
  TensorInfo t;
  const auto dtype = v.find("dtype");
  if (dtype == v.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError("missing or non-string 'dtype'");
  }
  const std::string code = dtype->get<std::string>();
  PRAXIS_ASSIGN_OR_RETURN(t.dtype, SafetensorsDtype(code));
  PRAXIS_ASSIGN_OR_RETURN(t.shape, ParseShape(v));
  PRAXIS_RETURN_IF_ERROR(ParseOffsets(v, data_bytes, code, &t));
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

// The tensors must tile [0, data_bytes) exactly, in byte order. An overlap aliases two parameters
// (a hostile file served 86 tensors out of one range); a gap or trailing bytes are data nothing
// names. The safetensors reference implementation refuses all three too.
absl::Status CheckLayout(const std::map<std::string, TensorInfo>& entries, uint64_t data_bytes) {
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  by_offset.reserve(entries.size());
  for (const auto& [name, t] : entries) by_offset.emplace_back(&name, &t);
  // Stable, so that ties are reported in name order.
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
  });
  uint64_t covered = 0;
  std::pair<const std::string*, const TensorInfo*> last{nullptr, nullptr};
  for (const auto& [name, t] : by_offset) {
    if (t->begin < covered) {
      return absl::InvalidArgumentError(absl::StrCat("tensors '", *last.first, "' ",
                                                     Offsets(*last.second), " and '", *name, "' ",
                                                     Offsets(*t), " overlap"));
    }
    if (t->begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat("bytes [", covered, ", ", t->begin,
                                                     ") of the data region belong to no tensor "
                                                     "(before '",
                                                     *name, "')"));
    }
    covered = t->end;
    last = {name, t};
  }
  if (covered != data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(data_bytes - covered, " trailing bytes: the data region has ", data_bytes,
                     " bytes, its tensors end at ", covered));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> ParseSafetensorsHeaderLength(absl::string_view first_8_bytes,
                                                      uint64_t file_bytes) {
  if (file_bytes < 8 || first_8_bytes.size() < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_bytes, " bytes, too short for the 8-byte header length"));
  }
  uint64_t n = 0;
  std::memcpy(&n, first_8_bytes.data(), 8);  // little-endian, as the host (safetensors.cc)
  if (n > file_bytes - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", n, " exceeds the file (", file_bytes, " bytes)"));
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("header length ", n, " exceeds the limit of ",
                                                   kMaxSafetensorsHeaderBytes, " bytes"));
  }
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeaderJson(absl::string_view json,
                                                             uint64_t file_bytes) {
  SafetensorsHeader out;
  out.data_start = 8 + json.size();
  if (out.data_start > file_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header length ", json.size(), " exceeds the file (", file_bytes, " bytes)"));
  }
  const Json header = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", json.size(), "-byte header is not valid JSON"));
  }
  if (!header.is_object()) return absl::InvalidArgumentError("header is not a JSON object");
  const uint64_t data_bytes = file_bytes - out.data_start;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      PRAXIS_RETURN_IF_ERROR(ParseMetadata(value, &out.metadata));
      continue;
    }
    absl::StatusOr<TensorInfo> info = ParseEntry(value, data_bytes);
    if (!info.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': ", info.status().message()));
    }
    out.entries.emplace(name, *std::move(info));
  }
  PRAXIS_RETURN_IF_ERROR(CheckLayout(out.entries, data_bytes));
  return out;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file) {
  PRAXIS_ASSIGN_OR_RETURN(const uint64_t n, ParseSafetensorsHeaderLength(file, file.size()));
  return ParseSafetensorsHeaderJson(file.substr(8, n), file.size());
}

absl::StatusOr<torch::ScalarType> SafetensorsDtype(absl::string_view name) {
  for (const DtypeCode& c : kDtypes) {
    if (name == c.name) return c.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported dtype \"", name, "\""));
}

absl::StatusOr<std::string> SafetensorsDtypeName(torch::ScalarType dtype) {
  for (const DtypeCode& c : kDtypes) {
    if (c.dtype == dtype) return std::string(c.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors has no code for dtype ", c10::toString(dtype)));
}

}  // namespace praxis::wire
