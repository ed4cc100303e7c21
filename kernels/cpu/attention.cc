#include "kernels/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
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
      split_floats += group * (c + (c + kKeyChunk - 1) / kKeyChunk * head_dim);
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

}  // namespace

bool SplitsDecodeRows(const ForwardBatch& batch, const AttentionShape& shape, int threads,
                      DecodeSplit split) {
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  return ChooseSplit(batch, MakeUnits(batch, group, shape.num_kv_heads), group, shape.head_dim,
                     threads, split);
}

template <typename T>
bool PagedAttention(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
                    int64_t layer, const float* q, const KvPoolLayout& layout,
                    const T* kv_pool, const std::type_identity_t<T>* host_pool,
                    const float* vsum_rows,
                    const TopThetaConfig& config, float* o, DecodeSplit split) {
  const int64_t d = shape.head_dim;
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  const int64_t q_dim = shape.num_heads * d;
  const int64_t kv_dim = shape.num_kv_heads * d;
  CHECK_LE(group, kMaxGroup);
  const bool theta = config.active();

  const std::vector<Unit> units = MakeUnits(batch, group, shape.num_kv_heads);
  // Where a unit's rows are: q and o of its first token ([group, d]; later tokens follow at a
  // stride of q_dim), its (layer, KV head), and (Top-θ) the running V sums VMC needs (WriteKv
  // fills these rows only when the sequence keeps sums).
  struct At {
    const SeqChunk* seq;
    int64_t pos, lh;
    const float* q;
    float* o;
    const float* vsum;
  };
  auto at = [&](const Unit& unit) {
    const SeqChunk& seq = batch.seqs[unit.seq];
    const int64_t row = seq.token_offset + unit.token;
    const int64_t off = row * q_dim + unit.kv_head * group * d;
    const float* vsum = theta && vsum_rows && seq.pages.v_sum
                            ? vsum_rows + row * kv_dim + unit.kv_head * d
                            : nullptr;
    return At{&seq, seq.start_pos + unit.token, layer * shape.num_kv_heads + unit.kv_head,
              q + off, o + off, vsum};
  };
  auto run_unit = [&](const Unit& unit, Scratch<T>& scratch) {
    const At a = at(unit);
    const Tile tile{a.pos, unit.num_tokens, group};
    if (theta) {
      TopThetaTile(*a.seq, layer, a.lh, tile, unit.kv_head * group, shape, layout, kv_pool,
                   host_pool, a.q, q_dim, a.vsum, kv_dim, a.o, config, scratch);
    } else {
      DenseTile(*a.seq, a.lh, tile, d, shape.scale, layout, kv_pool, a.q, q_dim, a.o, scratch);
      CountDense(scratch.stats, layer, group, unit.num_tokens, a.pos);
    }
  };
  // fn(i, scratch) for i in [0, n) across the pool, each thread with its scratch; counters
  // go to batch.stats.
  std::mutex stats_mu;
  auto parallel = [&](int64_t n, const auto& fn) {
    pool.ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
      Scratch<T>& scratch = ThreadScratch<T>();
      scratch.stats.Reset(shape.num_layers);
      for (int64_t i = begin; i < end; ++i) fn(i, scratch);
      if (batch.stats) {
        std::lock_guard<std::mutex> lock(stats_mu);
        batch.stats->Add(scratch.stats);
      }
    });
  };

  if (!ChooseSplit(batch, units, group, d, pool.num_threads(), split)) {
    parallel(int64_t(units.size()), [&](int64_t u, Scratch<T>& scratch) {
      run_unit(units[u], scratch);
    });
    return false;
  }

  // Flash-decoding: the long decode rows are worked a key chunk at a time, in rounds of the
  // pool: (1) scores and each chunk's row maxima (the other units whole, meanwhile), (2) exp
  // against the row max, each chunk's Σe and (dense) Σ e·V; then dense (3) per unit, the
  // chunks' sums added in order, ÷ Σe; Top-θ (3) per chunk, the keep test and pass 2 into the
  // chunk's sums, (4) per unit, those added in order, then SDC and VMC. The arithmetic is
  // DenseTile's and TopThetaRow's (kKeyChunk), so the bits are the same as one thread working
  // each unit whole. (Finishing a unit on the thread that ends its last chunk, counted down by
  // an atomic, saved a round; ThreadSanitizer reported a race there that we could not
  // explain, and a round costs a few microseconds.)
  struct Split {
    const Unit* unit;
    int64_t L, first_chunk;  // its chunks' index in the flat chunk list
    size_t e;                // its scores, [group, L], at e_all + e
  };
  std::vector<Split> splits;
  std::vector<const Unit*> whole;
  std::vector<std::pair<int32_t, int32_t>> chunks;  // (split, chunk)
  size_t e_floats = 0;
  for (const Unit& u : units) {
    if (!Splittable(batch, u)) {
      whole.push_back(&u);
      continue;
    }
    const int64_t L = batch.seqs[u.seq].start_pos + u.token + 1;
    splits.push_back({&u, L, int64_t(chunks.size()), e_floats});
    for (int64_t c = 0; c * kKeyChunk < L; ++c) {
      chunks.emplace_back(int32_t(splits.size() - 1), int32_t(c));
    }
    e_floats += size_t(group * L);
  }
  const int64_t num_chunks = int64_t(chunks.size());
  // The calling thread's buffers, kept across calls (the names below refer to them from every
  // thread, not to each thread's own).
  struct Buffers {
    std::vector<float> e, max, row_max, sum, row_sum, ev, thr, kept_sum;
    std::vector<int64_t> kept_n;
  };
  thread_local Buffers buffers;
  std::vector<float>& e_all = buffers.e;          // each split unit's scores, then exps
  std::vector<float>& chunk_max = buffers.max;    // [chunk, group] the chunk's row maxima
  std::vector<float>& row_max = buffers.row_max;  // [split, group] the rows' maxima
  std::vector<float>& chunk_sum = buffers.sum;    // [chunk, group] its Σe
  std::vector<float>& row_sum = buffers.row_sum;  // [split, group] the rows' Σe (D_full)
  std::vector<float>& chunk_ev = buffers.ev;      // [chunk, group, d] its Σ e·V (Top-θ: kept)
  std::vector<float>& thr = buffers.thr;          // [split, group] Top-θ's keep thresholds
  std::vector<float>& kept_sum = buffers.kept_sum;  // [chunk, group] Σe of the rows kept
  std::vector<int64_t>& kept_n = buffers.kept_n;    // [chunk, group] the rows kept
  e_all.resize(e_floats);
  chunk_max.resize(num_chunks * group);
  row_max.resize(splits.size() * group);
  chunk_sum.resize(num_chunks * group);
  row_sum.resize(splits.size() * group);
  chunk_ev.resize(num_chunks * group * d);
  if (theta) {
    thr.resize(splits.size() * group);
    kept_sum.resize(num_chunks * group);
    kept_n.resize(num_chunks * group);
  }
  const int64_t num_whole = int64_t(whole.size());
  parallel(num_whole + num_chunks, [&](int64_t i, Scratch<T>& scratch) {
    if (i < num_whole) {
      run_unit(*whole[i], scratch);
      return;
    }
    const auto [s, c] = chunks[i - num_whole];
    const Split& sp = splits[s];
    const At a = at(*sp.unit);
    // The maxima in a local array while the keys are scored (other threads write the chunks
    // beside this one in chunk_max), then stored.
    float mx[kMaxGroup];
    std::fill(mx, mx + group, -std::numeric_limits<float>::infinity());
    const int64_t c0 = c * kKeyChunk;
    Scores(*a.seq, a.lh, Tile{a.pos, 1, group}, c0, std::min(sp.L, c0 + kKeyChunk), d,
           shape.scale, layout, kv_pool, a.q, q_dim, e_all.data() + sp.e, sp.L, mx,
           scratch.widened);
    std::copy(mx, mx + group, chunk_max.data() + (sp.first_chunk + c) * group);
  });
  // fold(per_chunk, si, r): split unit si's row r of a [chunk, group] array, added over its
  // chunks in order (maxima: max), as the whole row's sums are (a few numbers per chunk: on
  // this thread, between the rounds).
  auto fold = [&](const auto& per_chunk, size_t si, int64_t r, auto op) {
    const Split& sp = splits[si];
    auto acc = per_chunk[sp.first_chunk * group + r];
    for (int64_t c = 1; c * kKeyChunk < sp.L; ++c) {
      acc = op(acc, per_chunk[(sp.first_chunk + c) * group + r]);
    }
    return acc;
  };
  const auto max_op = [](float x, float y) { return std::max(x, y); };
  const auto add_op = [](auto x, auto y) { return x + y; };
  for (size_t si = 0; si < splits.size(); ++si) {
    for (int64_t r = 0; r < group; ++r) row_max[si * group + r] = fold(chunk_max, si, r, max_op);
  }
  parallel(num_chunks, [&](int64_t i, Scratch<T>& scratch) {
    const auto [s, c] = chunks[i];
    const Split& sp = splits[s];
    const At a = at(*sp.unit);
    const int64_t c0 = c * kKeyChunk, c1 = std::min(sp.L, c0 + kKeyChunk);
    float* e = e_all.data() + sp.e;
    const int64_t k = sp.first_chunk + c;
    for (int64_t r = 0; r < group; ++r) {
      chunk_sum[k * group + r] = ExpShiftSum(e + r * sp.L + c0, c1 - c0, row_max[s * group + r]);
    }
    if (!theta) {
      float* ev = chunk_ev.data() + k * group * d;
      std::fill(ev, ev + group * d, 0.0f);
      SumEV(*a.seq, a.lh, Tile{a.pos, 1, group}, c0, c1, d, layout, kv_pool, e, sp.L,
            [&](int64_t r) { return ev + r * d; }, scratch.widened);
    }
  });
  for (size_t si = 0; si < splits.size(); ++si) {
    for (int64_t r = 0; r < group; ++r) row_sum[si * group + r] = fold(chunk_sum, si, r, add_op);
  }
  // A split unit's output rows: its chunks' Σ e·V added in order.
  auto add_chunks = [&](size_t si, float* o_unit) {
    const Split& sp = splits[si];
    for (int64_t r = 0; r < group; ++r) {
      float* out = o_unit + r * d;
      const float* ev = chunk_ev.data() + sp.first_chunk * group * d + r * d;
      std::copy(ev, ev + d, out);
      for (int64_t c = 1; c * kKeyChunk < sp.L; ++c) {
        const float* part = ev + c * group * d;
        for (int64_t x = 0; x < d; ++x) out[x] += part[x];
      }
    }
  };
  if (!theta) {
    parallel(int64_t(splits.size()), [&](int64_t si, Scratch<T>& scratch) {
      const At a = at(*splits[si].unit);
      add_chunks(si, a.o);
      for (int64_t r = 0; r < group; ++r) Scale(1.0f / row_sum[si * group + r], a.o + r * d, d);
      CountDense(scratch.stats, layer, group, 1, a.pos);
    });
    return true;
  }
  // Top-θ. The keep thresholds: a few floats per row on this thread, or, where exact top-k
  // sorts each row, across the pool.
  auto thresholds = [&](int64_t si, Scratch<T>& scratch) {
    const Split& sp = splits[si];
    KeepThresholds(layer, sp.L, group, sp.unit->kv_head * group, e_all.data() + sp.e, sp.L,
                   row_max.data() + si * group, row_sum.data() + si * group, config,
                   scratch.sorted, thr.data() + si * group);
  };
  if (config.top_k || config.recorder) {
    parallel(int64_t(splits.size()), thresholds);
  } else {
    for (size_t si = 0; si < splits.size(); ++si) thresholds(int64_t(si), ThreadScratch<T>());
  }
  parallel(num_chunks, [&](int64_t i, Scratch<T>& scratch) {
    const auto [s, c] = chunks[i];
    const Split& sp = splits[s];
    const At a = at(*sp.unit);
    const int64_t c0 = c * kKeyChunk, k = sp.first_chunk + c;
    KeepPass(*a.seq, a.lh, a.pos, group, d, layout, kv_pool, host_pool, e_all.data() + sp.e,
             sp.L, thr.data() + s * group, row_sum.data() + s * group, config.retain_factor, c0,
             std::min(sp.L, c0 + kKeyChunk),
             KeptSums{chunk_ev.data() + k * group * d, kept_sum.data() + k * group,
                      kept_n.data() + k * group},
             scratch);
  });
  parallel(int64_t(splits.size()), [&](int64_t si, Scratch<T>& scratch) {
    const Split& sp = splits[si];
    const At a = at(*sp.unit);
    add_chunks(si, a.o);
    float d_kept[kMaxGroup];
    int64_t kept[kMaxGroup];
    for (int64_t r = 0; r < group; ++r) {
      d_kept[r] = fold(kept_sum, si, r, add_op);
      kept[r] = fold(kept_n, si, r, add_op);
    }
    Compensate(layer, sp.L, group, sp.unit->kv_head * group, d, thr.data() + si * group,
               row_sum.data() + si * group, d_kept, kept, a.vsum, a.o, config, scratch.stats);
  });
  return true;
}

#define THETASERVE_KV_ELEMENT(T)                                                          \
  template void WriteKv<T>(const ForwardBatch&, const AttentionShape&, int64_t, const float*, \
                           const float*, const KvPoolLayout&, T*, float*);                  \
  template bool PagedAttention<T>(ThreadPool&, const ForwardBatch&, const AttentionShape&,   \
                                  int64_t, const float*, const KvPoolLayout&, const T*,      \
                                  const T*, const float*, const TopThetaConfig&, float*,  \
                                  DecodeSplit);
THETASERVE_KV_ELEMENT(float)
THETASERVE_KV_ELEMENT(F16)
THETASERVE_KV_ELEMENT(Bf16)
THETASERVE_KV_ELEMENT(Fp8E4M3)
THETASERVE_KV_ELEMENT(Fp8E5M2)
THETASERVE_KV_ELEMENT(Q8_0)
#undef THETASERVE_KV_ELEMENT

}  // namespace thetaserve::kernels::cpu
