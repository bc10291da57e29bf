#pragma once

// Order statistics of a benchmark's repeats: every figure docs/benchmarks.md reports is a median
// (or a percentile) of repeated timings, taken here the one way. Pure functions; thread-safe.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace praxis::bench {

// The element of rank floor(q · n) in v sorted (the largest for q >= 1); 0 for an empty v.
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(std::max(q, 0.0) * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

// Quantile(v, 0.5): of an even count the upper of the two middle elements.
inline double Median(std::vector<double> v) { return Quantile(std::move(v), 0.5); }

// max / min of v, how far a benchmark's repeats ranged; 0 for an empty v.
inline double Spread(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const auto [least, most] = std::minmax_element(v.begin(), v.end());
  return *most / *least;
}

}  // namespace praxis::bench
