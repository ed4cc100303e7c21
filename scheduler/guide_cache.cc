#include "scheduler/guide_cache.h"

namespace thetaserve::scheduler {

std::atomic<int64_t>& GuideCacheBytesHeld() {
  static std::atomic<int64_t> held{0};
  return held;
}

}  // namespace thetaserve::scheduler
