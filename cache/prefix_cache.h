// Automatic prefix caching: full blocks of tokens whose K and V pages stay in the pool after
// the sequence that computed them moves on or finishes, so that a later sequence whose tokens
// begin the same way adopts those pages instead of computing them again (a shared system
// prompt, a few-shot preamble, the earlier turns of a chat, a preempted sequence's own
// prefix).
//
// A block is found by a hash of its tokens chained with its parent's key, and linked to its
// parent by the parent's serial number (unique for the cache's life). A match checks the
// block's tokens and that its parent is the block matched just before, so a hash collision
// costs a miss, never a block computed after other tokens; a sequence stops registering blocks
// at the first collision or at a parent no longer cached.
//
// Pages held only by the cache are reclaimable: the pool counts them (num_cached_only) and
// MakeRoom frees the least recently used ones when the scheduler needs pages — leaves first
// (blocks no other cached block follows), then, if that is not enough, any block no sequence
// holds (what follows it can no longer be matched and goes the same way later). Blocks are
// only ever shared while nobody writes them: under the full V policy a block's K and V rows do
// not change once computed (the sparse policy compacts V in place, so the engine runs the
// cache only under the full policy).
// Thread-safety: none; owned by the engine thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/page_pool.h"
#include "cache/sequence_kv.h"

namespace thetaserve::cache {

class PrefixCache {
 public:
  // Where a sequence stands in the cache: the key and serial of its last matched or
  // registered block (serial 0 before its first), the blocks whose pages it shares with
  // the cache (adopted or registered by it: key and serial, in order), and whether it stopped
  // registering (a collision, or a parent evicted while the sequence ran).
  struct Cursor {
    uint64_t root = 0;  // the key of the sequence's empty prefix (RootKey of its salt)
    uint64_t key = 0;
    uint64_t serial = 0;
    bool stopped = false;
    std::vector<std::pair<uint64_t, uint64_t>> held;
  };

  using KeyFn = uint64_t (*)(uint64_t parent, std::span<const int32_t> tokens);
  // `key_fn` replaces BlockKey (tests force collisions with it). `root_key` is the key of the
  // empty prefix, the parent of every first block; by default drawn at random, so that blocks
  // whose keys collide cannot be prepared offline to keep other prompts out of the cache.
  explicit PrefixCache(const KvShape& shape, KeyFn key_fn = &BlockKey,
                       std::optional<uint64_t> root_key = std::nullopt);
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The key of the block `tokens` (block_size of them) following the prefix `parent`.
  static uint64_t BlockKey(uint64_t parent, std::span<const int32_t> tokens);
  // The key of the empty prefix of requests with this salt: blocks of different salts never
  // match (their first blocks' parents differ, which Find checks).
  uint64_t RootKey(std::string_view salt) const;
  // A cursor at the empty prefix of this salt.
  Cursor Start(std::string_view salt) const;

  // The longest run of cached blocks that begins `tokens`, at most `max_blocks`; changes
  // nothing. `pinned_pages`: how many of the run's pages only the cache holds now (adopting
  // the run takes them out of what MakeRoom can free).
  struct Match {
    uint64_t root = 0;  // RootKey of the salt looked up
    std::vector<uint64_t> keys;
    int64_t pinned_pages = 0;
    int64_t blocks() const { return static_cast<int64_t>(keys.size()); }
  };
  Match Find(std::span<const int32_t> tokens, int64_t max_blocks, const PagePool& pool,
             std::string_view salt = {}) const;
  // Of the run's pages, those a sequence holds other than `leaving`: once `leaving` released
  // theirs, adopting the run takes none of these from the pool (the rest it pins: they would be
  // reclaimable). A page is held beyond the cache's own reference by as many as hold it.
  int64_t PagesHeldBeyond(const Match& match, const std::vector<const SequenceKv*>& leaving,
                          const PagePool& pool) const;
  // Appends the matched blocks to `kv` (which must hold no blocks), marks them recently used
  // and moves `cursor` (from Start of the same salt) after them. `match` must come from Find
  // with nothing changed since.
  void Adopt(const Match& match, SequenceKv& kv, PagePool& pool, Cursor* cursor);
  // Registers blocks [from_block, to_block) of a sequence (tokens `tokens`, pages `kv`'s, every
  // row computed), following `cursor`, and advances it. A block already cached under the same
  // parent and tokens stays as it is (the sequence keeps its own copy).
  void Insert(std::span<const int32_t> tokens, int64_t from_block, int64_t to_block,
              const SequenceKv& kv, PagePool& pool, Cursor* cursor);
  // Called after the sequence behind `cursor` released its pages: the blocks it held that no
  // sequence holds now become reclaimable. Resets the cursor (to its salt's start).
  void Released(const PagePool& pool, Cursor* cursor);

  // Frees reclaimable blocks, least recently used leaves first, until the pool has `pages`
  // free pages; returns whether it has them.
  bool MakeRoom(PagePool& pool, int64_t pages);
  // Drops every block (pages no sequence holds return to the pool).
  void Clear(PagePool& pool);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Blocks no sequence holds (their pages are the pool's num_cached_only()).
  int64_t num_reclaimable_blocks() const {
    return static_cast<int64_t>(leaves_.size() + inner_.size());
  }
  uint64_t root_key() const { return root_; }
  // Blocks freed by MakeRoom since start.
  int64_t num_evicted() const { return evicted_; }

 private:
  enum class Where : uint8_t { kHeld, kLeaves, kInner };
  struct Block {
    uint64_t serial = 0;
    uint64_t parent_key = 0;
    uint64_t parent_serial = 0;    // 0: the first block of a prefix
    std::vector<int32_t> tokens;   // [block_size]
    std::vector<int32_t> k_pages;  // [tables]
    std::vector<int32_t> v_pages;  // [tables]
    int32_t children = 0;          // cached blocks whose parent this is
    Where where = Where::kHeld;    // held by a sequence, or in one of the reclaimable lists
    uint64_t last_used = 0;        // tick of its last use; its place in leaves_ or inner_
  };
  using Map = std::unordered_map<uint64_t, Block>;

  // Whether a sequence holds the block (a block's pages are taken and released together, so
  // its first K page speaks for all).
  static bool InUse(const Block& b, const PagePool& pool) { return pool.refcount(b.k_pages[0]) > 1; }
  // The block `key` if it is the one with this serial.
  Block* Get(uint64_t key, uint64_t serial);
  // Puts a block no sequence holds on the reclaimable list it belongs to, at its last use.
  void MakeReclaimable(uint64_t key, Block& b);
  void Unlist(Block& b);
  // Marks a block used now (keeping it on its list, if it is on one).
  void Touch(uint64_t key, Block& b);
  void Drop(Map::iterator it, PagePool& pool);

  KvShape shape_;
  KeyFn key_fn_;
  uint64_t root_;
  Map blocks_;
  // Blocks no sequence holds, by last use (tick -> key), least recently used first: leaves
  // (no cached block follows them), then inner blocks. A run is released leaf first, so its
  // first blocks are the more recent.
  std::map<uint64_t, uint64_t> leaves_, inner_;
  uint64_t tick_ = 0;
  uint64_t next_serial_ = 1;
  int64_t evicted_ = 0;
};

}  // namespace thetaserve::cache
