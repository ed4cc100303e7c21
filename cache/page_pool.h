// A pool of equal KV pages. A page holds `block_size` rows × head_dim of one (layer, KV head);
// K and V pages come from the same pool, so every V page freed is capacity for new work.
// Thread-safety: none; the engine thread owns the pool.
#pragma once

#include <cstdint>
#include <vector>

namespace thetaserve::cache {

enum class PageKind : uint8_t { kFree = 0, kK = 1, kV = 2 };

class PagePool {
 public:
  PagePool(int64_t num_pages, int32_t block_size);

  int64_t num_pages() const { return static_cast<int64_t>(refs_.size()); }
  int32_t block_size() const { return block_size_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t num_used(PageKind kind) const { return used_[static_cast<int>(kind)]; }
  int64_t num_used() const { return num_pages() - num_free(); }
  // Pages whose only reference is the prefix cache's (RefCached): reclaimable on demand, so
  // capacity figures count them as free (PrefixCache::MakeRoom turns them into free pages).
  int64_t num_cached_only(PageKind kind) const { return cached_only_[static_cast<int>(kind)]; }
  int64_t num_cached_only() const { return cached_only_[1] + cached_only_[2]; }

  // Check, then commit: Allocate must only be called after CanAllocate said yes.
  bool CanAllocate(int64_t n) const { return n <= num_free(); }
  int32_t Allocate(PageKind kind);
  // Adds a reference (a page shared by two sequences, e.g. a common prefix).
  void Ref(int32_t page);
  // Drops a reference; the page returns to the free list at zero. Freed pages are reused
  // first (LIFO), which keeps the working set warm in caches.
  void Release(int32_t page);
  int32_t refcount(int32_t page) const { return refs_[page]; }
  // The prefix cache's reference: like Ref, and marks the page so that the pool knows when the
  // cache is the page's last holder. ReleaseCached drops it (the page is freed at zero).
  void RefCached(int32_t page);
  void ReleaseCached(int32_t page);
  PageKind kind(int32_t page) const { return kinds_[page]; }
  bool cached(int32_t page) const { return cached_[page] != 0; }

 private:
  int32_t block_size_;
  std::vector<int32_t> free_;     // stack of free page ids
  std::vector<int32_t> refs_;     // [num_pages]
  std::vector<PageKind> kinds_;   // [num_pages]
  std::vector<uint8_t> cached_;   // [num_pages]: the prefix cache holds one of the references
  int64_t used_[3] = {0, 0, 0};   // by PageKind
  int64_t cached_only_[3] = {0, 0, 0};  // by PageKind: cached_ and refs_ == 1
};

}  // namespace thetaserve::cache
