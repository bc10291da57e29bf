#include "server/batching/batch_sizer.h"

#include <algorithm>

namespace praxis::batching {
namespace {

// A size counts once measured this often: one batch may have met a noisy moment of the host.
constexpr int64_t kMinSamples = 2;
// Weight of a new measurement in a size's moving average.
constexpr double kNewWeight = 0.25;

}  // namespace

BatchSizer::BatchSizer(Options options) : options_(options) {
  const int64_t max_rows = std::max<int64_t>(1, options_.max_rows);
  for (int64_t s = 1; s < max_rows; s *= 2) sizes_.push_back(s);
  sizes_.push_back(max_rows);
}

BatchSizer::Key& BatchSizer::Find(const std::string& key) {
  auto it = keys_.find(key);
  if (it == keys_.end()) {
    if (static_cast<int64_t>(keys_.size()) >= std::max<int64_t>(1, options_.max_keys)) {
      keys_.erase(std::min_element(keys_.begin(), keys_.end(), [](const auto& a, const auto& b) {
        return a.second.last_used < b.second.last_used;
      }));
    }
    Key k;
    k.sizes.resize(sizes_.size());
    k.current = sizes_.size() - 1;
    it = keys_.emplace(key, std::move(k)).first;
  }
  it->second.last_used = ++uses_;
  return it->second;
}

size_t BatchSizer::SizeIndex(int64_t rows) const {
  size_t i = 0;
  while (i + 1 < sizes_.size() && sizes_[i + 1] <= rows) ++i;
  return i;
}

void BatchSizer::Choose(Key& k) const {
  double best = 0;
  for (const Measured& m : k.sizes) {
    if (m.samples >= kMinSamples) best = std::max(best, m.rows_per_second);
  }
  if (best <= 0) return;
  for (size_t i = 0; i < k.sizes.size(); ++i) {
    const Measured& m = k.sizes[i];
    if (m.samples >= kMinSamples && m.rows_per_second >= (1 - options_.tolerance) * best) {
      k.current = i;
      return;
    }
  }
}

int64_t BatchSizer::TakeRows(const std::string& key, int64_t queued_rows) {
  if (options_.probe_every <= 0) return sizes_.back();
  Key& k = Find(key);
  size_t use = k.current;
  if (++k.since_probe >= options_.probe_every) {
    // A probe only where the queue holds more than the smaller size: a shorter queue gives a batch
    // of that size anyway, measured as it comes.
    const bool down = k.current > 0 && queued_rows > sizes_[k.current - 1];
    const bool up = k.current + 1 < sizes_.size() && queued_rows > sizes_[k.current];
    if (up && (k.probe_up || !down)) {
      use = k.current + 1;
    } else if (down) {
      use = k.current - 1;
    }
    if (use != k.current) {
      k.probe_up = use < k.current;  // the other way next time
      k.since_probe = 0;
    }
  }
  return sizes_[use];
}

int64_t BatchSizer::Rows(const std::string& key) const {
  if (options_.probe_every <= 0) return sizes_.back();
  const auto it = keys_.find(key);
  return it == keys_.end() ? sizes_.back() : sizes_[it->second.current];
}

std::vector<std::pair<std::string, int64_t>> BatchSizer::Held() const {
  std::vector<std::pair<std::string, int64_t>> held;
  held.reserve(keys_.size());
  for (const auto& [key, k] : keys_) held.emplace_back(key, sizes_[k.current]);
  return held;
}

void BatchSizer::Observe(const std::string& key, int64_t rows, absl::Duration took) {
  if (options_.probe_every <= 0 || rows < 1 || took <= absl::ZeroDuration()) return;
  Key& k = Find(key);
  Measured& m = k.sizes[SizeIndex(rows)];
  const double rate = static_cast<double>(rows) / absl::ToDoubleSeconds(took);
  if (m.samples == 0) {
    m.rows_per_second = rate;
  } else if (m.samples == 1) {
    // The better of the first two: a size's first batch may have paid for its warm-up (on a GPU,
    // its graph's capture).
    m.rows_per_second = std::max(m.rows_per_second, rate);
  } else {
    m.rows_per_second += kNewWeight * (rate - m.rows_per_second);
  }
  ++m.samples;
  Choose(k);
}

}  // namespace praxis::batching
