// Next tokens remembered per state, for guides whose next tokens depend on their automaton's
// state alone (a regular expression's, a JSON object's pushdown state): a string's contents,
// dozens of steps in one state, walk the vocabulary once. A guide is shared by a call's
// completions and read by the sampling threads at once, so the memory is locked; what it holds
// is bounded per guide and over all guides, and a set most of the vocabulary passes is held as
// a bitmap (a 49k vocabulary: 6 KiB, where its ids would take 192 KiB). Keys hold the
// vocabulary's address: a guide lives for a request, within the engine whose vocabularies
// outlive it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/guided_choice.h"

namespace thetaserve::scheduler {

constexpr int64_t kMaxGuideCacheBytes = int64_t(1) << 20;        // one guide's
constexpr int64_t kMaxGuideCacheBytesTotal = int64_t(64) << 20;  // all guides'

// Bytes held by every GuideCache alive (for the bound over all guides, and tests).
std::atomic<int64_t>& GuideCacheBytesHeld();

// What a key holds: a grammar's keys (its parse's stacks) are strings of up to 64 KiB.
template <typename Key>
int64_t GuideKeyBytes(const Key&) {
  return int64_t(sizeof(Key));
}
inline int64_t GuideKeyBytes(const std::string& key) {
  return int64_t(sizeof(std::string) + key.size());
}

template <typename Key>
class GuideCache {
 public:
  GuideCache() = default;
  GuideCache(const GuideCache&) = delete;
  GuideCache& operator=(const GuideCache&) = delete;
  ~GuideCache() { GuideCacheBytesHeld().fetch_sub(held_); }

  // The next tokens from `key` in `vocab` into *allowed (ascending): remembered, or found by
  // walk(allowed) and remembered while the bounds allow (and, where walk returns a bool, when
  // it returns true: a walk cut short by a guide's own bounds found only some of them).
  template <typename Walk>
  void Allowed(const TokenBytesIndex& vocab, const Key& key, const Walk& walk,
               std::vector<int32_t>* allowed) const {
    std::shared_ptr<const Entry> entry;
    {
      absl::MutexLock lock(&mu_);
      auto it = map_.find(std::make_pair(&vocab, key));
      if (it != map_.end()) entry = it->second;
    }
    if (entry) {
      entry->Read(allowed);
      return;
    }
    if constexpr (std::is_same_v<std::invoke_result_t<const Walk&, std::vector<int32_t>*>,
                                 bool>) {
      if (!walk(allowed)) return;
    } else {
      walk(allowed);
    }
    auto made = std::make_shared<Entry>(*allowed, vocab.size());
    const int64_t bytes = made->bytes() + GuideKeyBytes(key);
    absl::MutexLock lock(&mu_);
    if (held_ + bytes > kMaxGuideCacheBytes) return;
    if (GuideCacheBytesHeld().fetch_add(bytes) + bytes > kMaxGuideCacheBytesTotal) {
      GuideCacheBytesHeld().fetch_sub(bytes);
      return;
    }
    if (map_.emplace(std::make_pair(&vocab, key), std::move(made)).second) {
      held_ += bytes;
    } else {
      GuideCacheBytesHeld().fetch_sub(bytes);
    }
  }

 private:
  // Ascending ids, or a bitmap of them where that is smaller.
  class Entry {
   public:
    Entry(const std::vector<int32_t>& ids, size_t vocab_size) {
      if (ids.size() * 32 > vocab_size) {
        bits_.assign((vocab_size + 63) / 64, 0);
        for (int32_t id : ids) bits_[size_t(id) / 64] |= uint64_t(1) << (id % 64);
        for (uint64_t word : bits_) count_ += size_t(__builtin_popcountll(word));  // Read's size
      } else {
        ids_ = ids;
      }
    }
    void Read(std::vector<int32_t>* allowed) const {
      if (bits_.empty()) {
        allowed->assign(ids_.begin(), ids_.end());
        return;
      }
      allowed->resize(count_);
      int32_t* out = allowed->data();
      for (size_t w = 0; w < bits_.size(); ++w) {
        const int32_t base = int32_t(w * 64);
        uint64_t word = bits_[w];
        if (word == ~uint64_t(0)) {  // most of them where most of the vocabulary passes
          for (int32_t i = 0; i < 64; ++i) out[i] = base + i;
          out += 64;
          continue;
        }
        for (; word != 0; word &= word - 1) *out++ = base + int32_t(__builtin_ctzll(word));
      }
    }
    int64_t bytes() const {
      return int64_t(sizeof(Entry) + ids_.size() * sizeof(int32_t) +
                     bits_.size() * sizeof(uint64_t));
    }

   private:
    std::vector<int32_t> ids_;
    std::vector<uint64_t> bits_;
    size_t count_ = 0;
  };

  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::pair<const TokenBytesIndex*, Key>,
                              std::shared_ptr<const Entry>>
      map_ ABSL_GUARDED_BY(mu_);
  mutable int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace thetaserve::scheduler
