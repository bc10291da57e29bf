#include "model/mask_cache.h"

#include "common/status_macros.h"

namespace praxis::model {

absl::StatusOr<std::shared_ptr<const TowerMask>> MaskCache::GetTower(const MaskKey& key) {
  return Get(key, [&key]() -> absl::StatusOr<TowerMask> {
    PRAXIS_ASSIGN_OR_RETURN(BlockMask block, BuildTowerMask(key));
    return TowerMask{std::move(block), {}, {}};
  });
}

int64_t TowerMask::nbytes() const {
  return block.nbytes() + plan.nbytes() + (dense.defined() ? dense.nbytes() : 0);
}

}  // namespace praxis::model
