#include "cache/prefix_cache.h"

#include <algorithm>
#include <random>

#include "absl/container/flat_hash_map.h"
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

PrefixCache::PrefixCache(const KvShape& shape, KeyFn key_fn, std::optional<uint64_t> root_key)
    : shape_(shape), key_fn_(key_fn) {
  if (root_key) {
    root_ = *root_key;
  } else {
    std::random_device rd;
    root_ = (uint64_t(rd()) << 32) ^ rd();
  }
}

uint64_t PrefixCache::BlockKey(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = Mix(parent ^ 0x2545f4914f6cdd1dull);
  for (int32_t t : tokens) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

uint64_t PrefixCache::RootKey(std::string_view salt) const {
  if (salt.empty()) return root_;
  uint64_t h = Mix(root_ ^ 0x5a175a175a175a17ull);
  for (unsigned char c : salt) h = Mix(h ^ c);
  return h;
}

PrefixCache::Cursor PrefixCache::Start(std::string_view salt) const {
  Cursor c;
  c.root = RootKey(salt);
  return c;
}

PrefixCache::Block* PrefixCache::Get(uint64_t key, uint64_t serial) {
  auto it = blocks_.find(key);
  return it != blocks_.end() && it->second.serial == serial ? &it->second : nullptr;
}

PrefixCache::Match PrefixCache::Find(std::span<const int32_t> tokens, int64_t max_blocks,
                                     const PagePool& pool, std::string_view salt) const {
  const int64_t bs = shape_.block_size;
  max_blocks = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / bs);
  Match match;
  match.root = RootKey(salt);
  uint64_t key = match.root, serial = 0;
  for (int64_t b = 0; b < max_blocks; ++b) {
    const auto block_tokens = tokens.subspan(b * bs, bs);
    const uint64_t next = key_fn_(key, block_tokens);
    auto it = blocks_.find(next);
    if (it == blocks_.end() || it->second.parent_serial != serial || it->second.parent_key != key ||
        !std::equal(block_tokens.begin(), block_tokens.end(), it->second.tokens.begin())) {
      break;
    }
    match.keys.push_back(next);
    if (!InUse(it->second, pool)) match.pinned_pages += 2 * shape_.tables();
    key = next;
    serial = it->second.serial;
  }
  return match;
}

int64_t PrefixCache::PagesHeldBeyond(const Match& match,
                                     const std::vector<const SequenceKv*>& leaving,
                                     const PagePool& pool) const {
  const auto holders = SequenceKv::PageHolders(leaving);
  int64_t n = 0;
  auto count = [&](int32_t page) {
    const auto it = holders.find(page);
    n += pool.refcount(page) > 1 + (it == holders.end() ? 0 : it->second);
  };
  for (uint64_t key : match.keys) {
    const Block& b = blocks_.at(key);
    for (int32_t page : b.k_pages) count(page);
    for (int32_t page : b.v_pages) count(page);
  }
  return n;
}

void PrefixCache::Adopt(const Match& match, SequenceKv& kv, PagePool& pool, Cursor* cursor) {
  CHECK(kv.blocks() == 0) << "Adopt into a sequence that already has pages";
  *cursor = Cursor();
  cursor->root = match.root;
  for (uint64_t key : match.keys) {
    Block& b = blocks_.at(key);
    CHECK(b.parent_serial == cursor->serial) << "Adopt of a stale match";
    if (b.where != Where::kHeld) Unlist(b);
    b.last_used = ++tick_;
    kv.AppendSharedBlock(pool, b.k_pages.data(), b.v_pages.data());
    cursor->held.emplace_back(key, b.serial);
    cursor->key = key;
    cursor->serial = b.serial;
  }
}

void PrefixCache::Insert(std::span<const int32_t> tokens, int64_t from_block, int64_t to_block,
                         const SequenceKv& kv, PagePool& pool, Cursor* cursor) {
  const int64_t bs = shape_.block_size;
  const int64_t tables = shape_.tables();
  CHECK(to_block <= kv.blocks() && to_block * bs <= static_cast<int64_t>(tokens.size()))
      << "Insert of blocks the sequence does not have";
  CHECK(kv.v_tail_start() == 0) << "the prefix cache needs the dense V store";
  for (int64_t b = from_block; b < to_block && !cursor->stopped; ++b) {
    Block* parent = nullptr;
    if (cursor->serial != 0 && !(parent = Get(cursor->key, cursor->serial))) {
      cursor->stopped = true;  // the parent was evicted: nothing could reach this block
      break;
    }
    const uint64_t parent_key = cursor->serial == 0 ? cursor->root : cursor->key;
    const auto block_tokens = tokens.subspan(b * bs, bs);
    const uint64_t key = key_fn_(parent_key, block_tokens);
    auto [it, inserted] = blocks_.try_emplace(key);
    Block& block = it->second;
    if (!inserted) {
      if (block.parent_serial != cursor->serial || block.parent_key != parent_key ||
          !std::equal(block_tokens.begin(), block_tokens.end(), block.tokens.begin())) {
        cursor->stopped = true;  // a collision: this sequence's blocks stay out of the cache
        break;
      }
      // Already cached (computed by another sequence at the same time, or again after a
      // request that ended on this block): used now; continue after it.
      Touch(key, block);
      cursor->key = key;
      cursor->serial = block.serial;
      continue;
    }
    block.serial = next_serial_++;
    block.last_used = ++tick_;
    block.parent_key = parent_key;
    block.parent_serial = cursor->serial;
    block.tokens.assign(block_tokens.begin(), block_tokens.end());
    block.k_pages.resize(tables);
    block.v_pages.resize(tables);
    for (int64_t t = 0; t < tables; ++t) {
      block.k_pages[t] = kv.k_page(t, b);
      block.v_pages[t] = kv.v_page(t, b);
      pool.RefCached(block.k_pages[t]);
      pool.RefCached(block.v_pages[t]);
    }
    if (parent && parent->children++ == 0 && parent->where == Where::kLeaves) {
      Unlist(*parent);
      MakeReclaimable(parent_key, *parent);  // now an inner block, at the same last use
    }
    cursor->held.emplace_back(key, block.serial);
    cursor->key = key;
    cursor->serial = block.serial;
  }
}

void PrefixCache::Released(const PagePool& pool, Cursor* cursor) {
  // Used until now; leaf first, so that a run's first blocks are the most recently used.
  for (auto h = cursor->held.rbegin(); h != cursor->held.rend(); ++h) {
    Block* b = Get(h->first, h->second);
    if (!b) continue;
    if (b->where == Where::kHeld) {
      b->last_used = ++tick_;
      if (!InUse(*b, pool)) MakeReclaimable(h->first, *b);
    }
  }
  const uint64_t root = cursor->root;
  *cursor = Cursor();
  cursor->root = root;
}

void PrefixCache::MakeReclaimable(uint64_t key, Block& b) {
  auto& list = b.children > 0 ? inner_ : leaves_;
  b.where = b.children > 0 ? Where::kInner : Where::kLeaves;
  list.emplace(b.last_used, key);
}

void PrefixCache::Unlist(Block& b) {
  if (b.where == Where::kLeaves) leaves_.erase(b.last_used);
  if (b.where == Where::kInner) inner_.erase(b.last_used);
  b.where = Where::kHeld;
}

void PrefixCache::Touch(uint64_t key, Block& b) {
  const bool listed = b.where != Where::kHeld;
  if (listed) Unlist(b);
  b.last_used = ++tick_;
  if (listed) MakeReclaimable(key, b);
}

void PrefixCache::Drop(Map::iterator it, PagePool& pool) {
  Block& b = it->second;
  CHECK(b.where != Where::kHeld && !InUse(b, pool)) << "dropping a block a sequence holds";
  Unlist(b);
  for (int32_t p : b.k_pages) pool.ReleaseCached(p);
  for (int32_t p : b.v_pages) pool.ReleaseCached(p);
  if (Block* parent = Get(b.parent_key, b.parent_serial)) {
    if (--parent->children == 0 && parent->where == Where::kInner) {
      Unlist(*parent);
      MakeReclaimable(b.parent_key, *parent);  // a leaf now, at its own last use
    }
  }
  blocks_.erase(it);
}

bool PrefixCache::MakeRoom(PagePool& pool, int64_t pages) {
  while (pool.num_free() < pages) {
    // Leaves first; an inner block only when no leaf is left (its followers become
    // unreachable and are reclaimed in turn).
    std::map<uint64_t, uint64_t>& from = !leaves_.empty() ? leaves_ : inner_;
    if (from.empty()) break;
    Drop(blocks_.find(from.begin()->second), pool);
    ++evicted_;
  }
  return pool.num_free() >= pages;
}

void PrefixCache::Clear(PagePool& pool) {
  for (auto& [key, block] : blocks_) {
    for (int32_t p : block.k_pages) pool.ReleaseCached(p);
    for (int32_t p : block.v_pages) pool.ReleaseCached(p);
  }
  blocks_.clear();
  leaves_.clear();
  inner_.clear();
}

}  // namespace thetaserve::cache
