// Automatic prefix caching: full blocks of tokens whose K and V pages stay in the pool after
// the sequence that computed them moves on or finishes, so that a later sequence whose tokens
// begin the same way adopts those pages instead of computing them again (a shared system
// prompt, a few-shot preamble, the earlier turns of a chat, a preempted sequence's own
// prefix). A block is identified by a hash of its tokens chained with its parent's, and
// checked token for token on every match, so a hash collision can only cost a miss.
//
// Pages held only by the cache are reclaimable: the pool counts them (num_cached_only) and
// MakeRoom frees the least recently used ones when the scheduler needs pages. Blocks are only
// ever shared while nobody writes them: under the full V policy a block's K and V rows do not
// change once computed (the sparse policy compacts V in place, so the engine runs the cache
// only under the full policy).
// Thread-safety: none; owned by the engine thread.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "cache/page_pool.h"
#include "cache/sequence_kv.h"

namespace thetaserve::cache {

class PrefixCache {
 public:
  // The key of the empty prefix (the parent of a sequence's first block).
  static constexpr uint64_t kRoot = 0x9e3779b97f4a7c15ull;

  using KeyFn = uint64_t (*)(uint64_t parent, std::span<const int32_t> tokens);
  // `key_fn` replaces BlockKey (tests force collisions with it).
  explicit PrefixCache(const KvShape& shape, KeyFn key_fn = &BlockKey)
      : shape_(shape), key_fn_(key_fn) {}
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The key of the block `tokens` (block_size of them) following the prefix `parent`.
  static uint64_t BlockKey(uint64_t parent, std::span<const int32_t> tokens);

  // Adopts into `kv` (which must hold no blocks) the longest run of cached blocks that begins
  // `tokens`, at most `max_blocks` of them; marks them recently used. Returns the number of
  // blocks adopted; *last_key is the key of the last one (kRoot when none).
  int64_t Adopt(std::span<const int32_t> tokens, int64_t max_blocks, SequenceKv& kv,
                PagePool& pool, uint64_t* last_key);
  // Registers blocks [from_block, to_block) of a sequence (their tokens are `tokens`' and
  // their pages `kv`'s; every row of them computed), block from_block following the prefix
  // `parent`. A block already cached under its key stays as it is (the sequence keeps its own
  // copy). Returns the key of block to_block - 1 (parent when the range is empty).
  uint64_t Insert(std::span<const int32_t> tokens, int64_t from_block, int64_t to_block,
                  uint64_t parent, const SequenceKv& kv, PagePool& pool);

  // Frees least recently used blocks that no sequence holds until the pool has `pages` free
  // pages; returns whether it has them.
  bool MakeRoom(PagePool& pool, int64_t pages);
  // Drops every block (pages no sequence holds return to the pool).
  void Clear(PagePool& pool);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks evicted by MakeRoom since start.
  int64_t num_evicted() const { return evicted_; }

 private:
  struct Block {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;   // [block_size]
    std::vector<int32_t> k_pages;  // [tables]
    std::vector<int32_t> v_pages;  // [tables]
    int32_t children = 0;          // cached blocks whose parent this is (evicted last)
    std::list<uint64_t>::iterator lru;
  };
  // Whether a sequence holds the block (the cache's reference is then not the last one; a
  // block's pages are taken and released together, so its first K page speaks for all).
  bool InUse(const Block& b, const PagePool& pool) const { return pool.refcount(b.k_pages[0]) > 1; }
  void Drop(std::unordered_map<uint64_t, Block>::iterator it, PagePool& pool);

  KvShape shape_;
  KeyFn key_fn_;
  std::unordered_map<uint64_t, Block> blocks_;
  // Keys, least recently used first. A run of blocks is touched leaf first, so its first
  // blocks are the more recent: eviction takes a prefix's tail before its head.
  std::list<uint64_t> lru_;
  int64_t evicted_ = 0;
};

}  // namespace thetaserve::cache
