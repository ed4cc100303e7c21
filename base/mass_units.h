// The retained mass's fixed point, shared by the kernels that sum it (SeqPageTables::hit_mass)
// and the cache that ranks rows by it (SequenceKv::CompactV), which never include each other.
// Integer adds give the same sum in any order, so however many CPU threads or GPU blocks add to
// a row, and in whatever order, its bits are the same (float adds are not associative, and the
// mass budget ranks rows by these sums). Each add is truncated to 2^-32, so a row's sum is at
// most 2^-32 per add low; a NaN or negative mass (attention already broken) adds 0.
#pragma once

#if defined(__CUDACC__)
#define TS_MASS_HOST_DEVICE __host__ __device__
#else
#define TS_MASS_HOST_DEVICE
#endif

namespace thetaserve {

using MassUnits = unsigned long long;  // CUDA's 64-bit atomicAdd type
inline constexpr float kMassUnitsPerOne = 4294967296.0f;  // 2^32

TS_MASS_HOST_DEVICE inline MassUnits ToMassUnits(float mass) {
  // Exact scaling, then truncation; a mass is at most a group's heads (each e/D <= 1), far
  // below 2^32.
  return mass > 0.0f ? static_cast<MassUnits>(mass * kMassUnitsPerOne) : 0;
}
TS_MASS_HOST_DEVICE inline double MassValue(MassUnits units) {
  return static_cast<double>(units) / kMassUnitsPerOne;
}

}  // namespace thetaserve
