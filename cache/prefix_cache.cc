#include "cache/prefix_cache.h"

#include <algorithm>

#include "base/check.h"

namespace thetaserve::cache {
namespace {

// splitmix64's finaliser: every input bit moves every output bit.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t PrefixCache::BlockKey(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent ^ 0x2545f4914f6cdd1dull);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

int64_t PrefixCache::Adopt(std::span<const int32_t> tokens, int64_t max_blocks, SequenceKv& kv,
                           PagePool& pool, uint64_t* last_key) {
  CHECK(kv.blocks() == 0) << "Adopt into a sequence that already has pages";
  const int64_t bs = shape_.block_size;
  max_blocks = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / bs);
  std::vector<Block*> run;
  uint64_t key = kRoot;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const auto block_tokens = tokens.subspan(b * bs, bs);
    const uint64_t next = key_fn_(key, block_tokens);
    auto it = blocks_.find(next);
    if (it == blocks_.end() || it->second.parent != key ||
        !std::equal(block_tokens.begin(), block_tokens.end(), it->second.tokens.begin())) {
      break;
    }
    run.push_back(&it->second);
    key = next;
  }
  for (const Block* b : run) kv.AppendSharedBlock(pool, b->k_pages.data(), b->v_pages.data());
  // Leaf first, so that the run's first blocks end up the most recently used.
  for (auto b = run.rbegin(); b != run.rend(); ++b) lru_.splice(lru_.end(), lru_, (*b)->lru);
  *last_key = key;
  return static_cast<int64_t>(run.size());
}

uint64_t PrefixCache::Insert(std::span<const int32_t> tokens, int64_t from_block,
                             int64_t to_block, uint64_t parent, const SequenceKv& kv,
                             PagePool& pool) {
  const int64_t bs = shape_.block_size;
  const int64_t tables = shape_.tables();
  CHECK(to_block <= kv.blocks() && to_block * bs <= static_cast<int64_t>(tokens.size()))
      << "Insert of blocks the sequence does not have";
  CHECK(kv.v_tail_start() == 0) << "the prefix cache needs the dense V store";
  std::vector<uint64_t> added;
  for (int64_t b = from_block; b < to_block; ++b) {
    const auto block_tokens = tokens.subspan(b * bs, bs);
    const uint64_t key = key_fn_(parent, block_tokens);
    auto [it, inserted] = blocks_.try_emplace(key);
    if (inserted) {
      Block& block = it->second;
      block.parent = parent;
      block.tokens.assign(block_tokens.begin(), block_tokens.end());
      block.k_pages.resize(tables);
      block.v_pages.resize(tables);
      for (int64_t t = 0; t < tables; ++t) {
        block.k_pages[t] = kv.k_page(t, b);
        block.v_pages[t] = kv.v_page(t, b);
        pool.RefCached(block.k_pages[t]);
        pool.RefCached(block.v_pages[t]);
      }
      block.lru = lru_.insert(lru_.end(), key);
      if (auto p = blocks_.find(parent); p != blocks_.end()) ++p->second.children;
      added.push_back(key);
    }
    parent = key;
  }
  // The new blocks leaf first, as Adopt orders a run.
  for (auto k = added.rbegin(); k != added.rend(); ++k) {
    lru_.splice(lru_.end(), lru_, blocks_.at(*k).lru);
  }
  return parent;
}

void PrefixCache::Drop(std::unordered_map<uint64_t, Block>::iterator it, PagePool& pool) {
  Block& block = it->second;
  for (int32_t p : block.k_pages) pool.ReleaseCached(p);
  for (int32_t p : block.v_pages) pool.ReleaseCached(p);
  if (auto p = blocks_.find(block.parent); p != blocks_.end()) --p->second.children;
  lru_.erase(block.lru);
  blocks_.erase(it);
}

bool PrefixCache::MakeRoom(PagePool& pool, int64_t pages) {
  // Leaves only (a block's children are reachable only through it), oldest first; a pass can
  // turn a parent into a leaf, so passes repeat while they free something.
  bool freed = true;
  while (pool.num_free() < pages && freed) {
    freed = false;
    for (auto k = lru_.begin(); k != lru_.end() && pool.num_free() < pages;) {
      auto it = blocks_.find(*k);
      ++k;
      if (it->second.children > 0 || InUse(it->second, pool)) continue;
      Drop(it, pool);
      ++evicted_;
      freed = true;
    }
  }
  return pool.num_free() >= pages;
}

void PrefixCache::Clear(PagePool& pool) {
  for (auto& [key, block] : blocks_) {
    for (int32_t p : block.k_pages) pool.ReleaseCached(p);
    for (int32_t p : block.v_pages) pool.ReleaseCached(p);
  }
  blocks_.clear();
  lru_.clear();
}

}  // namespace thetaserve::cache
