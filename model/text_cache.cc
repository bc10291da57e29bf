#include "model/text_cache.h"

#include <ATen/Parallel.h>

#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"

namespace praxis::model {

torch::Tensor TextCache::Tokens(const torch::Tensor& text, Project project) {
  const torch::Tensor t = text.contiguous();
  const int64_t n = t.size(0);
  if (n == 0) return project(t);
  const size_t row_bytes = static_cast<size_t>(t.nbytes() / n);
  auto bytes = [&](int64_t i) {
    return absl::string_view(static_cast<const char*>(t.data_ptr()) + i * row_bytes, row_bytes);
  };
  auto row = [&](int64_t i) { return t.narrow(0, i, 1); };
  // Hashing and comparing read every byte of the text (a bench-config row: 320 KiB of float32),
  // so they run on the intra-op threads; lookups and projections stay on this one.
  std::vector<uint64_t> hashes(static_cast<size_t>(n));
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hashes[i] = absl::HashOf(bytes(i));
  });
  std::vector<std::shared_ptr<const ProjectedText>> found(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const TextKey key{hashes[i], t.size(1), t.size(2), static_cast<int>(t.scalar_type())};
    absl::StatusOr<std::shared_ptr<const ProjectedText>> hit =
        cache_.Get(key, [&]() -> absl::StatusOr<ProjectedText> {
          return ProjectedText{std::string(bytes(i)), project(row(i))};
        });
    if (!hit.ok()) throw std::runtime_error(std::string(hit.status().message()));
    found[i] = *std::move(hit);
  }
  std::vector<char> same(static_cast<size_t>(n));
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) same[i] = found[i]->text == bytes(i);
  });
  std::vector<torch::Tensor> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // Another text with the same hash (never seen in practice): projected, not cached.
    tokens[i] = same[i] ? found[i]->tokens : project(row(i));
  }
  return n == 1 ? tokens[0] : torch::cat(tokens, 0);
}

}  // namespace praxis::model
