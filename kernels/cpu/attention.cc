#include "kernels/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <queue>
#include <vector>

#include "base/check.h"
#include "kernels/cpu/vec.h"

namespace thetaserve::kernels::cpu {

template <typename T>
void WriteKv(const ForwardBatch& batch, const AttentionShape& shape, int64_t layer,
             const float* k, const float* v, const KvPoolLayout& layout, T* pool,
             float* vsum_rows) {
  const int64_t d = shape.head_dim;
  const int64_t kv_dim = shape.num_kv_heads * d;
  std::vector<float> stored(d);  // a V row as stored, widened
  for (const SeqChunk& seq : batch.seqs) {
    for (int32_t i = 0; i < seq.num_tokens; ++i) {
      const int64_t row = seq.token_offset + i;
      const int64_t pos = seq.start_pos + i;
      for (int64_t g = 0; g < shape.num_kv_heads; ++g) {
        const int64_t lh = layer * shape.num_kv_heads + g;
        const int32_t slot = static_cast<int32_t>(pos % layout.block_size);
        T* kd = pool + layout.RowOffset(seq.pages.KPage(lh, pos, layout.block_size), slot);
        T* vd = pool + layout.RowOffset(seq.pages.VPage(lh, pos, layout.block_size), slot);
        StoreRow(k + row * kv_dim + g * d, d, kd);
        StoreRow(v + row * kv_dim + g * d, d, vd);
        if (seq.pages.v_sum) {
          // The stored rows' sum, so that SumVRows (which reads them back) gives the same bits.
          float* sum = seq.pages.v_sum + lh * d;
          WidenRow(vd, d, stored.data());
          for (int64_t e = 0; e < d; ++e) sum[e] += stored[e];
          if (vsum_rows) std::memcpy(vsum_rows + row * kv_dim + g * d, sum, d * sizeof(float));
        }
      }
    }
  }
}

namespace {

#include "kernels/cpu/attention_unit.inc"

// This thread's scratch for pools of T, kept for the thread's life (one per thread and type:
// a thread_local inside a lambda template would be one per instantiation).
template <typename T>
Scratch<T>& ThreadScratch() {
  thread_local Scratch<T> scratch;
  return scratch;
}

// One unit of work: the query heads of one KV group for `num_tokens` consecutive tokens.
struct Unit {
  int32_t seq;
  int32_t token;  // first token, index within the sequence's chunk
  int32_t num_tokens;
  int32_t kv_head;
};

// A unit's work, in query rows × keys: its tokens × its longest row.
int64_t UnitCost(const ForwardBatch& batch, const Unit& u) {
  return int64_t(u.num_tokens) * (batch.seqs[u.seq].start_pos + u.token + u.num_tokens);
}

// Dense attention's counters for `n` tokens from position pos: Σ of their row lengths
// pos + 1 .. pos + n, every row read, every element kept.
void CountDense(AttentionStats& st, int64_t layer, int64_t group, int64_t n, int64_t pos) {
  const int64_t rows_read = n * (pos + 1) + n * (n - 1) / 2;
  st.v_rows_read += rows_read;
  st.v_rows_read_dense += rows_read;
  st.elements_kept += rows_read * group;
  st.elements_dense += rows_read * group;
  st.layer_kept[layer] += rows_read * group;
  st.layer_dense[layer] += rows_read * group;
}

// The batch's units, longest rows first: the pool hands out contiguous chunks of units as
// threads free up, and a causal chunk's last tokens cost the most.
std::vector<Unit> MakeUnits(const ForwardBatch& batch, int64_t group, int64_t num_kv_heads) {
  std::vector<Unit> units;
  for (int32_t s = 0; s < static_cast<int32_t>(batch.seqs.size()); ++s) {
    const int32_t n = batch.seqs[s].num_tokens;
    // Fewer tokens per tile where the rows are long: a thread's score buffer (tile × group ×
    // row length floats, kept for the thread's life) stays under kMaxScoreFloats.
    const int64_t row = int64_t(batch.seqs[s].start_pos) + n;
    const int32_t tile = static_cast<int32_t>(
        std::clamp<int64_t>(kMaxScoreFloats / (group * row), 1, kTileTokens));
    for (int32_t t = 0; t < n; t += tile) {
      for (int32_t g = 0; g < num_kv_heads; ++g) units.push_back({s, t, std::min(tile, n - t), g});
    }
  }
  std::stable_sort(units.begin(), units.end(), [&](const Unit& a, const Unit& b) {
    return UnitCost(batch, a) > UnitCost(batch, b);
  });
  return units;
}

// A one-token unit (a decode row, or a prefill row too long for tiles of more than one token)
// of at least four key chunks (shorter rows cost less than the extra round of threads does):
// the units PagedAttention may split.
constexpr int64_t kMinSplitKeys = 4 * kKeyChunk;
// Top-θ's pass 2 (the keep test and the gather of the kept rows) of a split row is split too
// from this many keys; a shorter row's pass 2 runs on one thread, as tasks of so few chunks
// cost more than they saved (measured at batch 1 on two threads: docs/results.md).
constexpr int64_t kMinPass2SplitKeys = 16 * kKeyChunk;
bool Splittable(const ForwardBatch& batch, const Unit& u) {
  return u.num_tokens == 1 && batch.seqs[u.seq].start_pos + u.token + 1 >= kMinSplitKeys;
}

// The busiest thread's work when `costs` (longest first) go, each whole, to the least loaded
// of `threads`; with `spread` more work then shared out evenly in pieces of up to kKeyChunk.
int64_t BusiestThread(const std::vector<int64_t>& costs, int threads, int64_t spread = 0) {
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> loads;
  for (int t = 0; t < threads; ++t) loads.push(0);
  int64_t busiest = 0, total = spread;
  for (int64_t c : costs) {
    const int64_t load = loads.top() + c;
    loads.pop();
    loads.push(load);
    busiest = std::max(busiest, load);
    total += c;
  }
  return spread > 0 ? std::max(busiest, (total + threads - 1) / threads + kKeyChunk) : busiest;
}

// See SplitsDecodeRows (attention.h). kAuto: split when the busiest thread, with the units
// handed out whole, would have more than a fifth more work than with the splittable rows
// spread over the threads, and when the split rows' scores (and partial sums) take no
// more memory than the threads' own score buffers may (it is memory on top of those).
bool ChooseSplit(const ForwardBatch& batch, const std::vector<Unit>& units, int64_t group,
                 int64_t head_dim, int threads, DecodeSplit split) {
  if (split == DecodeSplit::kNever) return false;
  int64_t total = 0, split_keys = 0, split_floats = 0;
  for (const Unit& u : units) {
    const int64_t c = UnitCost(batch, u);
    total += c;
    if (Splittable(batch, u)) {
      split_keys += c;
      // Scores, and per chunk its partial Σ e·V and five floats' worth of maxima and sums (at
      // most: a Top-θ row whose pass 2 stays whole keeps no partial sums).
      split_floats += group * (c + (c + kKeyChunk - 1) / kKeyChunk * (head_dim + 5));
    }
  }
  if (split_keys == 0) return false;  // no row long enough
  if (split == DecodeSplit::kAlways) return true;
  if (threads < 2 || split_floats > kMaxScoreFloats * threads) return false;
  // Handed out whole, the busiest thread has at most an even share plus the largest unit
  // (units[0]): if that is within a fifth of an even share, splitting cannot gain enough.
  if (5 * UnitCost(batch, units[0]) * threads <= total) return false;
  std::vector<int64_t> all, kept;  // every unit's cost; the units that stay whole
  for (const Unit& u : units) {
    all.push_back(UnitCost(batch, u));
    if (!Splittable(batch, u)) kept.push_back(all.back());
  }
  return 5 * BusiestThread(all, threads) > 6 * BusiestThread(kept, threads, split_keys);
}

// One PagedAttention call: its arguments, and the two ways of running its units (each on one
// thread, or with the long decode rows split by key chunks).
template <typename T>
class AttentionCall {
 public:
  AttentionCall(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
                const TopThetaConfig& config, const LayerAttention<T>& io)
      : pool_(pool),
        batch_(batch),
        shape_(shape),
        layer_(io.layer),
        q_(io.q),
        layout_(io.layout),
        kv_pool_(io.kv_pool),
        host_pool_(io.host_pool),
        vsum_rows_(io.vsum_rows),
        config_(config),
        o_(io.o),
        d_(shape.head_dim),
        group_(shape.num_heads / shape.num_kv_heads),
        q_dim_(shape.num_heads * d_),
        kv_dim_(shape.num_kv_heads * d_),
        theta_(config.active()) {
    CHECK_LE(group_, kMaxGroup);
  }

  int64_t group() const { return group_; }

  // Each unit whole, on one thread.
  void RunWhole(const std::vector<Unit>& units) {
    Parallel(int64_t(units.size()), [&](int64_t u, Scratch<T>& scratch) {
      RunUnit(units[u], scratch);
    });
  }

  // Flash-decoding: the long decode rows are worked a key chunk at a time, in rounds of the
  // pool: (1) scores and each chunk's row maxima (the other units whole, meanwhile), (2) exp
  // against the row max, each chunk's Σe and (dense) Σ e·V; then dense (3) per unit, the
  // chunks' sums added in order, ÷ Σe; Top-θ (3) the keep test and pass 2, per chunk into the
  // chunk's sums (rows of kMinPass2SplitKeys or more; shorter ones whole, with SDC and VMC),
  // (4) per split unit, those sums added in order, then SDC and VMC. The arithmetic is
  // DenseTile's and TopThetaKeep's (kKeyChunk), so the bits are the same as one thread working
  // each unit whole. (Finishing a unit on the thread that ends its last chunk, counted down by
  // an atomic, saved a round; ThreadSanitizer reported a race there that we could not
  // explain, and a round costs a few microseconds.)
  void RunSplit(const std::vector<Unit>& units) {
    // buf_ is this thread's: a second split call on it (none today) would resize it under the
    // first one's tasks.
    thread_local bool running = false;
    CHECK(!running) << "PagedAttention re-entered on one thread while it split rows";
    running = true;
    struct Done {
      bool& running;
      ~Done() { running = false; }
    } done{running};
    PlanSplit(units);
    ScoreChunks();
    for (size_t si = 0; si < splits_.size(); ++si) {
      const Split& sp = splits_[si];
      for (int64_t r = 0; r < group_; ++r) {
        buf_.row_max[si * group_ + r] = Fold(buf_.chunk_max, sp.first_chunk, sp.L, r,
                                             [](float x, float y) { return std::max(x, y); });
      }
    }
    ExpChunks();
    for (size_t si = 0; si < splits_.size(); ++si) {
      const Split& sp = splits_[si];
      for (int64_t r = 0; r < group_; ++r) {
        buf_.row_sum[si * group_ + r] = Fold(buf_.chunk_sum, sp.first_chunk, sp.L, r, Add);
      }
    }
    if (theta_) {
      FinishTopTheta();
    } else {
      FinishDense();
    }
  }

 private:
  // Where a unit's rows are: its K and V rows, its queries and output rows (its first
  // token's [group, d]; later tokens follow at a stride of q_dim), and (Top-θ) the running V
  // sums VMC needs (WriteKv fills these rows only when the sequence keeps sums).
  struct At {
    KvRows<T> kv;
    int64_t pos, first_head;
    Queries queries;
    float* o;
    const float* vsum;
  };
  At Where(const Unit& unit) const {
    const SeqChunk& seq = batch_.seqs[unit.seq];
    const int64_t row = seq.token_offset + unit.token;
    const int64_t off = row * q_dim_ + unit.kv_head * group_ * d_;
    const float* vsum = theta_ && vsum_rows_ && seq.pages.v_sum
                            ? vsum_rows_ + row * kv_dim_ + unit.kv_head * d_
                            : nullptr;
    const KvRows<T> kv{seq,     layer_,   layer_ * shape_.num_kv_heads + unit.kv_head,
                       layout_, kv_pool_, host_pool_, d_};
    return At{kv, seq.start_pos + unit.token, unit.kv_head * group_,
              Queries{q_ + off, q_dim_, shape_.scale}, o_ + off, vsum};
  }
  // The tile of a unit's first n tokens.
  Tile Tokens(const At& a, int64_t n) const { return Tile{a.pos, n, group_, a.first_head}; }

  void RunUnit(const Unit& unit, Scratch<T>& scratch) const {
    const At a = Where(unit);
    const Tile tile = Tokens(a, unit.num_tokens);
    if (theta_) {
      TopThetaTile(a.kv, tile, a.queries, a.vsum, kv_dim_, a.o, config_, scratch);
    } else {
      DenseTile(a.kv, tile, a.queries, a.o, scratch);
      CountDense(scratch.stats, layer_, group_, unit.num_tokens, a.pos);
    }
  }

  // fn(i, scratch) for i in [0, n) across the pool, each thread with its scratch; counters go
  // to batch.stats.
  template <typename F>
  void Parallel(int64_t n, const F& fn) {
    pool_.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
      Scratch<T>& scratch = ThreadScratch<T>();
      scratch.stats.Reset(shape_.num_layers);
      for (int64_t i = begin; i < end; ++i) fn(i, scratch);
      if (batch_.stats) {
        std::lock_guard<std::mutex> lock(stats_mu_);
        batch_.stats->Add(scratch.stats);
      }
    });
  }

  // A split unit: its row length; where its chunks start in the flat chunk list (chunks_,
  // and the [chunk, group] maxima and Σe), and in the chunks' sums of V (buf_.chunk_ev, and
  // Top-θ's kept_sum and kept_n; -1: a Top-θ row whose pass 2 stays whole needs none); where
  // its scores ([group, L]) start in buf_.e.
  struct Split {
    const Unit* unit;
    int64_t L, first_chunk, first_sums;
    size_t e;
  };
  // Whether a split unit's chunks sum their V rows apart (Top-θ: only where pass 2 splits).
  bool SplitsSums(int64_t L) const { return !theta_ || L >= kMinPass2SplitKeys; }

  // The units that split (chunks_: (split, chunk) for each of their chunks) and those that stay
  // whole; sizes the buffers.
  void PlanSplit(const std::vector<Unit>& units) {
    size_t e_floats = 0;
    int64_t sum_chunks = 0;
    for (const Unit& u : units) {
      if (!Splittable(batch_, u)) {
        whole_.push_back(&u);
        continue;
      }
      const int64_t L = batch_.seqs[u.seq].start_pos + u.token + 1;
      const int64_t num_chunks = (L + kKeyChunk - 1) / kKeyChunk;
      const int64_t first_sums = SplitsSums(L) ? sum_chunks : -1;
      if (first_sums >= 0) sum_chunks += num_chunks;
      splits_.push_back({&u, L, int64_t(chunks_.size()), first_sums, e_floats});
      for (int64_t c = 0; c < num_chunks; ++c) {
        chunks_.emplace_back(int32_t(splits_.size() - 1), int32_t(c));
      }
      e_floats += size_t(group_ * L);
    }
    const size_t num_chunks = chunks_.size(), rows = splits_.size() * group_;
    buf_.e.resize(e_floats);
    buf_.chunk_max.resize(num_chunks * group_);
    buf_.row_max.resize(rows);
    buf_.chunk_sum.resize(num_chunks * group_);
    buf_.row_sum.resize(rows);
    buf_.chunk_ev.resize(sum_chunks * group_ * d_);
    if (theta_) {
      buf_.thr.resize(rows);
      buf_.kept_sum.resize(sum_chunks * group_);
      buf_.kept_n.resize(sum_chunks * group_);
    }
  }

  // Round 1: each chunk's scores and row maxima; the whole units meanwhile.
  void ScoreChunks() {
    const int64_t num_whole = int64_t(whole_.size());
    Parallel(num_whole + int64_t(chunks_.size()), [&](int64_t i, Scratch<T>& scratch) {
      if (i < num_whole) {
        RunUnit(*whole_[i], scratch);
        return;
      }
      const auto [s, c] = chunks_[i - num_whole];
      const Split& sp = splits_[s];
      const At a = Where(*sp.unit);
      // The maxima in a local array while the keys are scored (other threads write the chunks
      // beside this one in chunk_max), then stored.
      float mx[kMaxGroup];
      std::fill(mx, mx + group_, -std::numeric_limits<float>::infinity());
      const int64_t c0 = c * kKeyChunk;
      Scores(a.kv, Tokens(a, 1), a.queries, c0, std::min(sp.L, c0 + kKeyChunk),
             ScoreRows{buf_.e.data() + sp.e, sp.L, mx}, scratch.widened);
      std::copy(mx, mx + group_, buf_.chunk_max.data() + (sp.first_chunk + c) * group_);
    });
  }

  // Round 2: each chunk's exps against its row's max, their Σe and (dense) Σ e·V.
  void ExpChunks() {
    Parallel(int64_t(chunks_.size()), [&](int64_t i, Scratch<T>& scratch) {
      const auto [s, c] = chunks_[i];
      const Split& sp = splits_[s];
      const int64_t c0 = c * kKeyChunk, c1 = std::min(sp.L, c0 + kKeyChunk);
      float* e = buf_.e.data() + sp.e;
      const int64_t k = sp.first_chunk + c;
      for (int64_t r = 0; r < group_; ++r) {
        buf_.chunk_sum[k * group_ + r] =
            ExpShiftSum(e + r * sp.L + c0, c1 - c0, buf_.row_max[s * group_ + r]);
      }
      if (!theta_) {
        const At a = Where(*sp.unit);
        float* ev = buf_.chunk_ev.data() + (sp.first_sums + c) * group_ * d_;
        std::fill(ev, ev + group_ * d_, 0.0f);
        SumEV(a.kv, Tokens(a, 1), c0, c1, e, sp.L, [&](int64_t r) { return ev + r * d_; },
              scratch.widened);
      }
    });
  }

  // Dense round 3: per unit, the chunks' Σ e·V added in order, ÷ Σe.
  void FinishDense() {
    Parallel(int64_t(splits_.size()), [&](int64_t si, Scratch<T>& scratch) {
      const At a = Where(*splits_[si].unit);
      AddChunks(si, a.o);
      for (int64_t r = 0; r < group_; ++r) {
        Scale(1.0f / buf_.row_sum[si * group_ + r], a.o + r * d_, d_);
      }
      CountDense(scratch.stats, layer_, group_, 1, a.pos);
    });
  }

  // Top-θ: the keep thresholds (a few floats per row on this thread or, where exact top-k sorts
  // each row, across the pool); round 3, pass 2 of a row of kMinPass2SplitKeys or more a chunk
  // per task, each shorter row's on one thread (tasks of a few chunks cost more than they save),
  // the whole rows listed first (the pool hands out runs of tasks in order, so they start in
  // the first runs); round 4 (only where some row's pass 2 split), per such unit, the chunks'
  // sums added in order, then SDC and VMC.
  void FinishTopTheta() {
    auto thresholds = [&](int64_t si, Scratch<T>& scratch) {
      KeepThresholds(Row(si), config_, scratch.sorted, buf_.thr.data() + si * group_);
    };
    if (config_.top_k || config_.recorder) {
      Parallel(int64_t(splits_.size()), thresholds);
    } else {
      for (size_t si = 0; si < splits_.size(); ++si) thresholds(int64_t(si), ThreadScratch<T>());
    }
    std::vector<std::pair<int32_t, int32_t>> tasks;  // (split, chunk, or -1: the whole row)
    for (size_t si = 0; si < splits_.size(); ++si) {
      if (!SplitsSums(splits_[si].L)) tasks.emplace_back(int32_t(si), -1);
    }
    const bool any_split = tasks.size() < splits_.size();
    for (const auto& [s, c] : chunks_) {
      if (SplitsSums(splits_[s].L)) tasks.emplace_back(s, c);
    }
    Parallel(int64_t(tasks.size()), [&](int64_t i, Scratch<T>& scratch) {
      const auto [s, c] = tasks[i];
      const Split& sp = splits_[s];
      const float* thr = buf_.thr.data() + s * group_;
      const At a = Where(*sp.unit);
      if (c < 0) {
        TopThetaKeep(Row(s), thr, a.kv, a.vsum, a.o, config_, scratch);
        return;
      }
      const int64_t c0 = c * kKeyChunk, k = sp.first_sums + c;
      KeepPass(Row(s), thr, a.kv, config_.retain_factor, c0, std::min(sp.L, c0 + kKeyChunk),
               KeptSums{buf_.chunk_ev.data() + k * group_ * d_, buf_.kept_sum.data() + k * group_,
                        buf_.kept_n.data() + k * group_},
               scratch);
    });
    if (!any_split) return;
    Parallel(int64_t(splits_.size()), [&](int64_t si, Scratch<T>& scratch) {
      const Split& sp = splits_[si];
      if (!SplitsSums(sp.L)) return;
      const At a = Where(*sp.unit);
      AddChunks(si, a.o);
      float d_kept[kMaxGroup];
      int64_t kept[kMaxGroup];
      for (int64_t r = 0; r < group_; ++r) {
        d_kept[r] = Fold(buf_.kept_sum, sp.first_sums, sp.L, r, Add);
        kept[r] = Fold(buf_.kept_n, sp.first_sums, sp.L, r, Add);
      }
      Compensate(Row(si), buf_.thr.data() + si * group_, d_kept, kept, a.vsum, a.o, config_,
                 scratch.stats);
    });
  }

  // Split unit si's rows as Top-θ reads them after pass 1.
  ThetaRow Row(int64_t si) const {
    const Split& sp = splits_[si];
    return ThetaRow{layer_, sp.L - 1, group_, sp.unit->kv_head * group_, d_,
                    buf_.e.data() + sp.e, sp.L, buf_.row_max.data() + si * group_,
                    buf_.row_sum.data() + si * group_};
  }

  // Row r of a split unit with L keys from a [chunk, group] array whose chunks of the unit
  // start at `first`, taken over its chunks in order with op (max, or +), as the whole row's
  // are (a few numbers per chunk: on the calling thread, between the rounds, or in a unit's
  // own task).
  template <typename V, typename Op>
  V Fold(const std::vector<V>& per_chunk, int64_t first, int64_t L, int64_t r, Op op) const {
    V acc = per_chunk[first * group_ + r];
    for (int64_t c = 1; c * kKeyChunk < L; ++c) {
      acc = op(acc, per_chunk[(first + c) * group_ + r]);
    }
    return acc;
  }
  static constexpr std::plus<> Add{};

  // Split unit si's output rows: its chunks' Σ e·V added in order.
  void AddChunks(size_t si, float* o_unit) const {
    const Split& sp = splits_[si];
    const float* ev = buf_.chunk_ev.data() + sp.first_sums * group_ * d_;  // [chunk, group, d]
    for (int64_t r = 0; r < group_; ++r) std::copy(ev + r * d_, ev + (r + 1) * d_, o_unit + r * d_);
    for (int64_t c = 1; c * kKeyChunk < sp.L; ++c) {
      for (int64_t r = 0; r < group_; ++r) AddTo(ev + (c * group_ + r) * d_, o_unit + r * d_, d_);
    }
  }

  // The split rows' buffers: the calling thread's, kept across calls (every thread of the pool
  // writes into them, each its own chunks).
  struct Buffers {
    std::vector<float> e;          // [split][group, L] each split unit's scores, then exps
    std::vector<float> chunk_max;  // [chunk, group] the chunk's row maxima
    std::vector<float> row_max;    // [split, group] the rows' maxima
    std::vector<float> chunk_sum;  // [chunk, group] its Σe
    std::vector<float> row_sum;    // [split, group] the rows' Σe (D_full)
    // The chunks that sum their V rows apart (Split::first_sums):
    std::vector<float> chunk_ev;   // [chunk, group, d] its Σ e·V (Top-θ: of the rows kept)
    std::vector<float> kept_sum;   // [chunk, group] Top-θ: Σe of the rows kept
    std::vector<int64_t> kept_n;   // [chunk, group] Top-θ: the rows kept
    std::vector<float> thr;        // [split, group] Top-θ's keep thresholds
  };
  static Buffers& CallerBuffers() {
    thread_local Buffers buffers;
    return buffers;
  }

  ThreadPool& pool_;
  const ForwardBatch& batch_;
  const AttentionShape& shape_;
  const int64_t layer_;
  const float* const q_;
  const KvPoolLayout& layout_;
  const T* const kv_pool_;
  const T* const host_pool_;  // the offload policy's V rows, or null
  const float* const vsum_rows_;
  const TopThetaConfig& config_;
  float* const o_;
  const int64_t d_, group_, q_dim_, kv_dim_;
  const bool theta_;
  std::mutex stats_mu_;
  // The split path's plan and buffers.
  std::vector<Split> splits_;
  std::vector<const Unit*> whole_;
  std::vector<std::pair<int32_t, int32_t>> chunks_;  // (split, chunk)
  Buffers& buf_ = CallerBuffers();
};

}  // namespace

bool SplitsDecodeRows(const ForwardBatch& batch, const AttentionShape& shape, int threads,
                      DecodeSplit split) {
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  return ChooseSplit(batch, MakeUnits(batch, group, shape.num_kv_heads), group, shape.head_dim,
                     threads, split);
}

template <typename T>
bool PagedAttention(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
                    const TopThetaConfig& config, const LayerAttention<T>& io,
                    DecodeSplit split) {
  CHECK(io.layer >= 0 && io.layer < shape.num_layers) << "layer " << io.layer;
  AttentionCall<T> call(pool, batch, shape, config, io);
  const std::vector<Unit> units = MakeUnits(batch, call.group(), shape.num_kv_heads);
  if (!ChooseSplit(batch, units, call.group(), shape.head_dim, pool.num_threads(), split)) {
    call.RunWhole(units);
    return false;
  }
  call.RunSplit(units);
  return true;
}

#define THETASERVE_KV_ELEMENT(T)                                                          \
  template void WriteKv<T>(const ForwardBatch&, const AttentionShape&, int64_t, const float*, \
                           const float*, const KvPoolLayout&, T*, float*);                  \
  template bool PagedAttention<T>(ThreadPool&, const ForwardBatch&, const AttentionShape&,   \
                                  const TopThetaConfig&, const LayerAttention<T>&,           \
                                  DecodeSplit);
THETASERVE_KV_ELEMENT(float)
THETASERVE_KV_ELEMENT(F16)
THETASERVE_KV_ELEMENT(Bf16)
THETASERVE_KV_ELEMENT(Fp8E4M3)
THETASERVE_KV_ELEMENT(Fp8E5M2)
THETASERVE_KV_ELEMENT(Q8_0)
#undef THETASERVE_KV_ELEMENT

}  // namespace thetaserve::kernels::cpu
