#include "model/config.h"

#include <algorithm>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/check.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "model/config_bounds.h"
#include "model/config_validate.h"

namespace praxis::model {
namespace {

// Ordered, so that the first unknown key reported is the first in the file, as in the reference.
using Json = nlohmann::ordered_json;

// The Python type name of a JSON value, as the reference's messages spell it.
std::string TypeName(const Json& v) {
  if (v.is_object()) return "dict";
  if (v.is_array()) return "list";
  if (v.is_string()) return "str";
  if (v.is_boolean()) return "bool";
  if (v.is_number_integer()) return "int";
  if (v.is_number_float()) return "float";
  return "NoneType";
}

// `v` as JSON text for an error message. Nested lists and objects are named, not dumped: dump()
// recurses, and a hostile value nested a million deep would overflow the stack.
std::string Shown(const Json& v) {
  const bool nested = v.is_structured() && std::any_of(v.begin(), v.end(), [](const Json& x) {
                        return x.is_structured();
                      });
  if (nested) return absl::StrCat("a nested ", TypeName(v));
  constexpr size_t kMaxShown = 200;  // and a long list is cut short
  std::string text = v.dump();
  if (text.size() > kMaxShown) text = absl::StrCat(text.substr(0, kMaxShown), "...");
  return text;
}

// A real config nests 4 deep. ordered_json copies (not moves) an object's members when their vector
// grows, and the copy recurses: a hostile config nested 10^5 deep would overflow the stack while it
// is parsed, so depth is checked on the text first (brackets inside strings do not count).
absl::Status CheckNesting(absl::string_view text) {
  constexpr int kMaxNesting = 64;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if ((ch == '[' || ch == '{') && ++depth > kMaxNesting) {
      return absl::InvalidArgumentError(
          absl::StrCat("config: JSON nested deeper than ", kMaxNesting, " levels"));
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

bool IsInt(const Json& v) {
  return v.is_number_integer() &&
         !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX});
}

bool Convert(const Json& v, int64_t* out) {
  if (!IsInt(v)) return false;
  *out = v.get<int64_t>();
  return true;
}
bool Convert(const Json& v, double* out) {
  if (!v.is_number()) return false;  // an integer is a number too; booleans are not
  *out = v.get<double>();
  return true;
}
bool Convert(const Json& v, bool* out) {
  if (!v.is_boolean()) return false;
  *out = v.get<bool>();
  return true;
}
bool Convert(const Json& v, std::string* out) {
  if (!v.is_string()) return false;
  *out = v.get<std::string>();
  return true;
}
bool Convert(const Json& v, std::vector<int64_t>* out) {
  if (!v.is_array() || !std::all_of(v.begin(), v.end(), IsInt)) return false;
  out->clear();
  for (const Json& x : v) out->push_back(x.get<int64_t>());
  return true;
}

const char* Expected(const int64_t*) { return "an integer"; }
const char* Expected(const double*) { return "a number"; }
const char* Expected(const bool*) { return "true or false"; }
const char* Expected(const std::string*) { return "a string"; }
const char* Expected(const std::vector<int64_t>*) { return "a list of integers"; }

// The fields of one JSON object at `path` (e.g. "backbone.encoder"). Open refuses a non-object and
// any key not in the known list before a field is read, as the reference's `_convert` does.
class ObjectReader {
 public:
  static absl::StatusOr<ObjectReader> Open(const Json& v, std::string path,
                                           std::initializer_list<absl::string_view> known) {
    if (!v.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": expected an object, got ", TypeName(v)));
    }
    for (const auto& [key, value] : v.items()) {
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": unknown key '", key, "'"));
      }
    }
    return ObjectReader(v, std::move(path));
  }

  // Reads `key` into `out`; a missing optional key leaves `out` (its default) alone.
  template <typename T>
  absl::Status Get(absl::string_view key, T* out, bool required = true) const {
    PRAXIS_ASSIGN_OR_RETURN(const Json* v, Find(key, required));
    if (v != nullptr && !Convert(*v, out)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Path(key), ": expected ", Expected(out), ", got ", Shown(*v)));
    }
    return absl::OkStatus();
  }

  // The value of `key`; nullptr when an optional key is absent.
  absl::StatusOr<const Json*> Find(absl::string_view key, bool required = true) const {
    auto it = j_.find(std::string(key));
    if (it != j_.end()) return &*it;
    if (!required) return nullptr;
    return absl::InvalidArgumentError(absl::StrCat(Path(key), ": missing required key"));
  }

  std::string Path(absl::string_view key) const { return absl::StrCat(path_, ".", key); }

 private:
  ObjectReader(const Json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const Json& j_;
  std::string path_;
};

// {"c_in": n} or {"c_out": n} at `key` of `r`.
absl::Status ReadWidth(const ObjectReader& r, absl::string_view key, const char* field,
                       int64_t* out) {
  PRAXIS_ASSIGN_OR_RETURN(const Json* v, r.Find(key));
  PRAXIS_ASSIGN_OR_RETURN(ObjectReader inner, ObjectReader::Open(*v, r.Path(key), {field}));
  return inner.Get(field, out);
}

absl::Status ReadMoe(const Json& v, std::string path, MoeConfig* m) {
  PRAXIS_ASSIGN_OR_RETURN(
      ObjectReader r,
      ObjectReader::Open(v, std::move(path), {"num_experts", "top_k", "expert_dim", "shared_dim"}));
  PRAXIS_RETURN_IF_ERROR(r.Get("num_experts", &m->num_experts));
  PRAXIS_RETURN_IF_ERROR(r.Get("top_k", &m->top_k));
  PRAXIS_RETURN_IF_ERROR(r.Get("expert_dim", &m->expert_dim));
  return r.Get("shared_dim", &m->shared_dim);
}

absl::Status ReadEncoder(const Json& v, std::string path, TowerConfig* t) {
  PRAXIS_ASSIGN_OR_RETURN(
      ObjectReader r,
      ObjectReader::Open(v, std::move(path),
                         {"depth", "ffn_dim", "moe_blocks", "tap_blocks", "video_in", "text_in"}));
  PRAXIS_RETURN_IF_ERROR(r.Get("depth", &t->depth));
  PRAXIS_RETURN_IF_ERROR(r.Get("ffn_dim", &t->ffn_dim));
  PRAXIS_RETURN_IF_ERROR(r.Get("moe_blocks", &t->moe_blocks));
  PRAXIS_RETURN_IF_ERROR(r.Get("tap_blocks", &t->tap_blocks));
  PRAXIS_RETURN_IF_ERROR(ReadWidth(r, "video_in", "c_in", &t->video_in_c_in));
  return ReadWidth(r, "text_in", "c_in", &t->text_in_c_in);
}

absl::Status ReadDecoder(const Json& v, std::string path, TowerConfig* t) {
  PRAXIS_ASSIGN_OR_RETURN(ObjectReader r,
                          ObjectReader::Open(v, std::move(path),
                                             {"depth", "ffn_dim", "moe_blocks", "unpatch_factor",
                                              "video_in", "video_out"}));
  PRAXIS_RETURN_IF_ERROR(r.Get("depth", &t->depth));
  PRAXIS_RETURN_IF_ERROR(r.Get("ffn_dim", &t->ffn_dim));
  PRAXIS_RETURN_IF_ERROR(r.Get("moe_blocks", &t->moe_blocks));
  PRAXIS_RETURN_IF_ERROR(r.Get("unpatch_factor", &t->unpatch_factor));
  PRAXIS_RETURN_IF_ERROR(ReadWidth(r, "video_in", "c_in", &t->video_in_c_in));
  return ReadWidth(r, "video_out", "c_out", &t->video_out_c_out);
}

absl::Status ReadAttention(const ObjectReader& r, int64_t* flex_block_size) {
  PRAXIS_ASSIGN_OR_RETURN(const Json* v, r.Find("attention", /*required=*/false));
  if (v == nullptr) return absl::OkStatus();
  PRAXIS_ASSIGN_OR_RETURN(ObjectReader a,
                          ObjectReader::Open(*v, r.Path("attention"), {"flex_block_size"}));
  return a.Get("flex_block_size", flex_block_size, /*required=*/false);
}

// The keys of `backbone`, read in the reference dataclass's field order so that the first error
// reported is the same one.
absl::Status ReadBackbone(const Json& v, BackboneConfig* c) {
  PRAXIS_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::Open(v, "backbone",
                                                             {"dim",
                                                              "num_heads",
                                                              "num_kv_heads",
                                                              "timestep_dim",
                                                              "num_registers",
                                                              "text_dim",
                                                              "dtype",
                                                              "moe",
                                                              "encoder",
                                                              "decoder",
                                                              "rope_theta",
                                                              "qk_norm",
                                                              "norm_eps",
                                                              "gelu_approximate",
                                                              "routed_scale",
                                                              "text_position_offset",
                                                              "decoder_frame_block_offset",
                                                              "clean_timestep",
                                                              "modulation_dtype",
                                                              "attention"}));
  for (const auto& [key, out] : {std::pair{"dim", &c->dim},
                                 {"num_heads", &c->num_heads},
                                 {"num_kv_heads", &c->num_kv_heads},
                                 {"timestep_dim", &c->timestep_dim},
                                 {"num_registers", &c->num_registers},
                                 {"text_dim", &c->text_dim}}) {
    PRAXIS_RETURN_IF_ERROR(r.Get(key, out));
  }
  PRAXIS_RETURN_IF_ERROR(r.Get("dtype", &c->dtype));
  PRAXIS_ASSIGN_OR_RETURN(const Json* moe, r.Find("moe"));
  PRAXIS_RETURN_IF_ERROR(ReadMoe(*moe, r.Path("moe"), &c->moe));
  PRAXIS_ASSIGN_OR_RETURN(const Json* enc, r.Find("encoder"));
  PRAXIS_RETURN_IF_ERROR(ReadEncoder(*enc, r.Path("encoder"), &c->encoder));
  PRAXIS_ASSIGN_OR_RETURN(const Json* dec, r.Find("decoder"));
  PRAXIS_RETURN_IF_ERROR(ReadDecoder(*dec, r.Path("decoder"), &c->decoder));
  constexpr bool kOptional = false;
  PRAXIS_RETURN_IF_ERROR(r.Get("rope_theta", &c->rope_theta, kOptional));
  PRAXIS_RETURN_IF_ERROR(r.Get("qk_norm", &c->qk_norm, kOptional));
  PRAXIS_RETURN_IF_ERROR(r.Get("norm_eps", &c->norm_eps, kOptional));
  PRAXIS_RETURN_IF_ERROR(r.Get("gelu_approximate", &c->gelu_approximate, kOptional));
  PRAXIS_RETURN_IF_ERROR(r.Get("routed_scale", &c->routed_scale, kOptional));
  PRAXIS_RETURN_IF_ERROR(r.Get("text_position_offset", &c->text_position_offset, kOptional));
  PRAXIS_RETURN_IF_ERROR(
      r.Get("decoder_frame_block_offset", &c->decoder_frame_block_offset, kOptional));
  PRAXIS_RETURN_IF_ERROR(r.Get("clean_timestep", &c->clean_timestep, kOptional));
  PRAXIS_RETURN_IF_ERROR(r.Get("modulation_dtype", &c->modulation_dtype, kOptional));
  return ReadAttention(r, &c->flex_block_size);
}

}  // namespace

bool TowerConfig::is_moe(int64_t block) const {
  return std::find(moe_blocks.begin(), moe_blocks.end(), block) != moe_blocks.end();
}

torch::ScalarType BackboneConfig::param_dtype() const {
  absl::StatusOr<torch::ScalarType> t = ParseDtype(dtype);
  // Every parsed config has a valid dtype.
  PRAXIS_CHECK(t.ok(), t.status().ToString().c_str());
  return *t;
}

absl::StatusOr<BackboneConfig> ParseConfig(const std::string& json_text) {
  PRAXIS_RETURN_IF_ERROR(CheckNesting(json_text));
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config: invalid JSON: ", e.what()));
  }
  if (!root.is_object() || !root.contains("backbone")) {
    return absl::InvalidArgumentError("config: missing top-level 'backbone' section");
  }
  BackboneConfig c;
  PRAXIS_RETURN_IF_ERROR(ReadBackbone(root["backbone"], &c));
  PRAXIS_RETURN_IF_ERROR(ValidateConfigValues(c));
  PRAXIS_RETURN_IF_ERROR(ValidateConfigBounds(c));
  return c;
}

absl::StatusOr<BackboneConfig> LoadConfig(const std::string& path) {
  const std::string file = IsDirectory(path) ? JoinPath(path, "config.json") : path;
  PRAXIS_ASSIGN_OR_RETURN(const std::string text, ReadRegularFile(file, kMaxConfigBytes));
  absl::StatusOr<BackboneConfig> c = ParseConfig(text);
  if (!c.ok()) {
    return absl::Status(c.status().code(), absl::StrCat(file, ": ", c.status().message()));
  }
  return c;
}

}  // namespace praxis::model
