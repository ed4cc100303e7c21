// cp.async as cuda_pipeline.h declares it, on the emulator: a copy's bytes are read when it is
// issued and written at its wait; until then its destination holds 0xFF bytes (NaN), so a
// kernel that reads shared memory before waiting reads garbage, as it may on a GPU.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_pipeline.h"
#include "emu_internal.h"

namespace {

// Writes the oldest n copies of `p` and forgets them.
void LandCopies(emu::PipelineState& p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(p.copies[i].dst, p.copies[i].bytes.data(), p.copies[i].bytes.size());
  }
  p.copies.erase(p.copies.begin(), p.copies.begin() + n);
}

}  // namespace

void __pipeline_memcpy_async(void* dst_shared, const void* src_global, size_t size_and_align,
                             size_t zfill) {
  const size_t n = size_and_align;
  if ((n != 4 && n != 8 && n != 16) || zfill > n ||
      reinterpret_cast<uintptr_t>(dst_shared) % n != 0 ||
      reinterpret_cast<uintptr_t>(src_global) % n != 0) {
    std::fprintf(stderr, "emu: __pipeline_memcpy_async of %zu bytes (zfill %zu) from %p to %p: the size must be 4, 8 or 16 and both addresses aligned to it\n",
                 n, zfill, src_global, dst_shared);
    std::abort();
  }
  emu::AsyncCopy c{static_cast<unsigned char*>(dst_shared), std::vector<unsigned char>(n, 0)};
  std::memcpy(c.bytes.data(), src_global, n - zfill);
  std::memset(dst_shared, 0xFF, n);  // until the wait
  emu::CurrentPipeline().copies.push_back(std::move(c));
}

void __pipeline_commit() {
  emu::PipelineState& p = emu::CurrentPipeline();
  p.group_ends.push_back(p.copies.size());
}

void __pipeline_wait_prior(size_t prior) {
  emu::PipelineState& p = emu::CurrentPipeline();
  if (p.group_ends.size() <= prior) return;
  const size_t done = p.group_ends.size() - prior;  // groups to land
  const size_t n = p.group_ends[done - 1];
  LandCopies(p, n);
  p.group_ends.erase(p.group_ends.begin(), p.group_ends.begin() + done);
  for (size_t& e : p.group_ends) e -= n;
}
