#include "cache/page_pool.h"

#include "base/check.h"

namespace thetaserve::cache {

PagePool::PagePool(int64_t num_pages, int32_t block_size)
    : block_size_(block_size),
      refs_(num_pages, 0),
      kinds_(num_pages, PageKind::kFree),
      cached_(num_pages, 0) {
  CHECK_GT(block_size, 0);
  free_.reserve(num_pages);
  // Lowest ids on top of the stack.
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

int32_t PagePool::Allocate(PageKind kind) {
  CHECK(!free_.empty()) << "Allocate without CanAllocate";
  CHECK(kind != PageKind::kFree);
  int32_t page = free_.back();
  free_.pop_back();
  refs_[page] = 1;
  kinds_[page] = kind;
  ++used_[static_cast<int>(kind)];
  return page;
}

void PagePool::Ref(int32_t page) {
  CHECK_GT(refs_[page], 0) << "Ref of a free page " << page;
  if (cached_[page] && refs_[page] == 1) --cached_only_[static_cast<int>(kinds_[page])];
  ++refs_[page];
}

void PagePool::Release(int32_t page) {
  CHECK_GT(refs_[page], 0) << "double release of page " << page;
  --refs_[page];
  if (cached_[page] && refs_[page] == 1) ++cached_only_[static_cast<int>(kinds_[page])];
  if (refs_[page] == 0) {
    CHECK(!cached_[page]) << "page " << page << " freed while the prefix cache holds it";
    --used_[static_cast<int>(kinds_[page])];
    kinds_[page] = PageKind::kFree;
    free_.push_back(page);
  }
}

void PagePool::RefCached(int32_t page) {
  CHECK(!cached_[page]) << "page " << page << " is already cached";
  Ref(page);  // a sequence holds the page too (Ref checked it is not free): not cached-only
  cached_[page] = 1;
}

void PagePool::ReleaseCached(int32_t page) {
  CHECK(cached_[page]) << "page " << page << " is not cached";
  if (refs_[page] == 1) --cached_only_[static_cast<int>(kinds_[page])];
  cached_[page] = 0;
  Release(page);
}

}  // namespace thetaserve::cache
