#include "model/tokenizer_bpe_model.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "model/tokenizer_utf8.h"

namespace thetaserve::model {
namespace {

std::string ByteFallbackPiece(int b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
  return buf;
}

}  // namespace

BpeModel::BpeModel(const TokenizerSpec& spec)
    : algorithm_(spec.merge_algorithm),
      byte_level_(spec.byte_level),
      byte_fallback_(spec.byte_fallback),
      fuse_unk_(spec.fuse_unk),
      ignore_merges_(spec.ignore_merges),
      unk_id_(spec.unk_id),
      scores_(spec.scores) {
  absl::flat_hash_map<std::string, int32_t> piece_to_id;
  piece_to_id.reserve(spec.pieces.size());
  vocab_.reserve(spec.pieces.size());
  std::string bytes;
  for (size_t id = 0; id < spec.pieces.size(); ++id) {
    const std::string& piece = spec.pieces[id];
    if (piece.empty()) continue;
    // Later duplicates win, as in llama.cpp's token_to_id and a JSON object's last key.
    piece_to_id.insert_or_assign(piece, static_cast<int32_t>(id));
    if (!byte_level_) {
      vocab_.insert_or_assign(piece, static_cast<int32_t>(id));
    } else if (ByteLevelToBytes(piece, &bytes)) {
      // A piece with characters outside the byte table can never equal mapped input.
      vocab_.insert_or_assign(bytes, static_cast<int32_t>(id));
    }
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = piece_to_id.find(ByteFallbackPiece(b));
    byte_fallback_ids_[b] = it == piece_to_id.end() ? -1 : it->second;
    byte_char_ids_[b] = byte_level_ ? Lookup(std::string(1, static_cast<char>(b))) : -1;
  }
  if (algorithm_ == MergeAlgorithm::kRanks) {
    merges_.reserve(spec.merges.size());
    for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
      const auto& [left, right] = spec.merges[rank];
      const auto l = piece_to_id.find(left);
      const auto r = piece_to_id.find(right);
      const auto m = piece_to_id.find(left + right);
      if (l == piece_to_id.end() || r == piece_to_id.end() || m == piece_to_id.end()) continue;
      // HF collects merges into a map, so a repeated pair keeps its last rank.
      merges_.insert_or_assign(PairKey(l->second, r->second),
                               Merge{static_cast<int32_t>(rank), m->second});
    }
  }
}

int32_t BpeModel::Lookup(std::string_view s) const {
  const auto it = vocab_.find(AsAbsl(s));
  return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::Encode(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (algorithm_ == MergeAlgorithm::kScores) {
    EncodeByScore(word, out);
    return;
  }
  if (ignore_merges_) {
    const int32_t id = Lookup(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  InitSymbols(word, &symbols);
  MergeByRank(&symbols);
  for (const Symbol& s : symbols) {
    if (s.len != 0) out->push_back(s.id);
  }
}

// HF BPE::merge_word: one symbol per character (per byte when byte-level); a character
// missing from the vocabulary becomes its <0xXX> byte tokens (byte_fallback, when all
// exist), else the unknown token (consecutive ones fused with fuse_unk), else nothing.
void BpeModel::InitSymbols(std::string_view word, std::vector<Symbol>* symbols) const {
  symbols->clear();
  auto add = [&](int32_t id, uint32_t start, uint32_t len) {
    const auto n = static_cast<int32_t>(symbols->size());
    if (n > 0) symbols->back().next = n;
    symbols->push_back(Symbol{id, n - 1, -1, start, len});
  };
  int32_t pending_unk_len = 0;  // bytes covered by an unknown token not yet added
  uint32_t pending_unk_start = 0;
  for (size_t i = 0; i < word.size();) {
    int len = 1;
    if (!byte_level_) DecodeUtf8At(word, i, &len);
    const auto start = static_cast<uint32_t>(i);
    i += len;
    const int32_t id = byte_level_ ? byte_char_ids_[static_cast<uint8_t>(word[start])]
                                   : Lookup(word.substr(start, len));
    if (id >= 0) {
      if (pending_unk_len > 0) {
        add(unk_id_, pending_unk_start, pending_unk_len);
        pending_unk_len = 0;
      }
      add(id, start, len);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (int k = 0; k < len; ++k) all &= byte_fallback_ids_[static_cast<uint8_t>(word[start + k])] >= 0;
      if (all) {
        // HF adds these without flushing a pending unknown token first.
        for (int k = 0; k < len; ++k) {
          add(byte_fallback_ids_[static_cast<uint8_t>(word[start + k])], start + k, 1);
        }
        continue;
      }
    }
    if (unk_id_ < 0) continue;
    if (pending_unk_len > 0 && fuse_unk_) {
      pending_unk_len += len;
    } else {
      if (pending_unk_len > 0) add(unk_id_, pending_unk_start, pending_unk_len);
      pending_unk_start = start;
      pending_unk_len = len;
    }
  }
  if (pending_unk_len > 0) add(unk_id_, pending_unk_start, pending_unk_len);
}

// HF Word::merge_all: a heap of (rank, position); stale entries are recognised by the pair
// at that position no longer producing the same token.
void BpeModel::MergeByRank(std::vector<Symbol>* symbols_ptr) const {
  std::vector<Symbol>& symbols = *symbols_ptr;
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
  };
  struct Later {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    }
  };
  // A heap in a reused buffer (std::priority_queue cannot lend its storage back).
  thread_local std::vector<Candidate> heap;
  heap.clear();
  auto push = [&](Candidate c) {
    heap.push_back(c);
    std::push_heap(heap.begin(), heap.end(), Later{});
  };
  auto find = [&](int32_t a, int32_t b) -> const Merge* {
    const auto it = merges_.find(PairKey(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find(symbols[i].id, symbols[i + 1].id)) {
      push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), Later{});
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& cur = symbols[top.pos];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[next_pos];
    const Merge* still = find(cur.id, right.id);
    if (still == nullptr || still->new_id != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[next_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* m = find(symbols[cur.prev].id, cur.id)) {
        push({m->rank, cur.prev, m->new_id});
      }
    }
    if (cur.next >= 0) {
      if (const Merge* m = find(cur.id, symbols[cur.next].id)) {
        push({m->rank, top.pos, m->new_id});
      }
    }
  }
}

// llama.cpp llm_tokenizer_spm: merge the adjacent pair whose concatenation is the
// highest-scoring token (leftmost on ties) until none is left; leftovers become bytes.
void BpeModel::EncodeByScore(std::string_view word, std::vector<int32_t>* out) const {
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  for (size_t i = 0; i < word.size();) {
    int len = 1;
    DecodeUtf8At(word, i, &len);
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{-1, n - 1, -1, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
    if (n > 0) symbols[n - 1].next = n;
    i += len;
  }
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    uint32_t size;
  };
  struct Lower {
    bool operator()(const Bigram& l, const Bigram& r) const {
      return l.score < r.score || (l.score == r.score && l.left > r.left);
    }
  };
  std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t size = symbols[left].len + symbols[right].len;
    const int32_t id = Lookup(word.substr(symbols[left].start, size));
    if (id < 0) return;
    const float score = static_cast<size_t>(id) < scores_.size() ? scores_[id] : 0.0f;
    queue.push({score, left, right, size});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != b.size) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    try_add(left.prev, b.left);
    try_add(b.left, left.next);
  }
  for (const Symbol& s : symbols) {
    if (s.len == 0) continue;
    const std::string_view text = word.substr(s.start, s.len);
    const int32_t id = Lookup(text);
    if (id >= 0) {
      out->push_back(id);
    } else {
      AppendBytes(text, out);
    }
  }
}

void BpeModel::AppendBytes(std::string_view bytes, std::vector<int32_t>* out) const {
  for (char c : bytes) {
    const int32_t id = byte_fallback_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      out->push_back(id);
    } else if (unk_id_ >= 0) {
      out->push_back(unk_id_);
    }
  }
}

}  // namespace thetaserve::model
