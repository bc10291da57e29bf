#pragma once

// The encoder's projected text tokens cached by the text's bytes: a robot sends the same
// instruction with every denoising step, and projecting it (two GEMMs over L × text_dim) was a
// tenth of a bench-config CPU step (docs/benchmarks.md, stop 33).

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "absl/functional/function_ref.h"
#include "common/shared_lru_cache.h"

namespace praxis::model {

// One row's text: its shape and dtype, and a hash of its bytes. Abseil's hash is seeded per
// process, so a client cannot aim a collision at another's instruction; a collision is caught
// anyway (TextCache compares the bytes).
struct TextKey {
  uint64_t hash = 0;
  int64_t len = 0;
  int64_t dim = 0;
  int dtype = 0;

  bool operator==(const TextKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TextKey& k) {
    return H::combine(std::move(h), k.hash, k.len, k.dim, k.dtype);
  }
};

// A cached projection: the text's bytes (to tell a hash collision from a hit) and its tokens.
struct ProjectedText {
  std::string text;
  torch::Tensor tokens;  // [1, L, dim], the model's compute dtype

  int64_t nbytes() const { return static_cast<int64_t>(text.size()) + tokens.nbytes(); }
};

// A SharedLruCache of projected texts, bounded by entries and bytes (each entry is charged its
// text and its tokens). Thread-safe; a text seen by several rows at once is projected once.
class TextCache {
 public:
  using Project = absl::FunctionRef<torch::Tensor(const torch::Tensor& rows)>;

  TextCache(int64_t max_entries, int64_t max_bytes)
      : cache_("a text projection", max_entries, max_bytes) {}

  // The projection of every row of `text` ([B, L, text_dim], on the host): each row's cached
  // tokens, or `project` of that row ([1, L, text_dim] → [1, L, dim]) on a miss, then kept.
  // Throws what `project` throws (LibTorch) and std::runtime_error for a failed build.
  torch::Tensor Tokens(const torch::Tensor& text, Project project);

  CacheStats stats() const { return cache_.stats(); }

 private:
  SharedLruCache<TextKey, ProjectedText> cache_;
};

}  // namespace praxis::model
