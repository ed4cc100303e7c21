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

constexpr int64_t kMaxGroup = 64;  // query heads per KV head

// Attention takes a sequence's new tokens this many at a time, so that pass 1 reads every K row
// (and dense attention every V row) once per tile instead of once per token: a prefill chunk
// attends over a long row that no longer fits in the core's caches. Decode tokens are tiles
// of one.
constexpr int32_t kTileTokens = 16;
// ...as long as a tile's scores stay under this many floats (16 MiB): long rows get fewer.
constexpr int64_t kMaxScoreFloats = int64_t(4) << 20;

// One unit of work: the query heads of one KV group for `num_tokens` consecutive tokens.
struct Unit {
  int32_t seq;
  int32_t token;  // first token, index within the sequence's chunk
  int32_t num_tokens;
  int32_t kv_head;
};

// What Σ e·V reads a V row of T as: T itself, or (row-quantized T) the row widened to f32.
template <typename T>
using ReadRow = std::conditional_t<kRowQuantized<T>, float, T>;

// Per-thread scratch, reused across units.
template <typename T>
struct Scratch {
  std::vector<float> e;      // [rows, L] exp(s - m); rows = tokens × group
  std::vector<float> sorted; // [L] for the (k+1)-th largest
  // Top-θ pass 2, per gather (TopThetaRow): the V rows each head keeps, their weights, and
  // (row-quantized T) the rows read, widened to f32.
  std::vector<const ReadRow<T>*> kept_rows;  // [group, kGatherRows]
  std::vector<float> kept_e;                 // [group, kGatherRows]
  std::vector<float> kept_widened;           // [kGatherRows, d]
  std::vector<float> widened;  // a block of 8-bit K or V rows as f32 (ReadBlock)
  std::vector<float> part;     // [rows, d] a key chunk's Σ e·V (DenseTile)
  AttentionStats stats;
};

// Σ e·V takes this many V rows at a time (their pointers in a small array).
constexpr int64_t kVBlock = 32;
// A row's keys are summed in chunks of this many (a multiple of kVBlock): Σe and Σ e·V start
// from zero in each chunk, in key order, and the chunks' sums are added in chunk order. A long
// decode row can then be worked by several threads, a chunk each (flash-decoding; see
// SplitsDecodeRows), and give the same bits as one thread working it whole. Rows of up to
// kKeyChunk keys are one chunk.
constexpr int64_t kKeyChunk = 512;
static_assert(kKeyChunk % kVBlock == 0);
// Top-θ's pass 2 gathers the kept V rows each time this many stored rows have been read (and at
// the end), so that its lists (and q8_0's widened rows) stay small and in cache whatever the
// row length. Σ e·V adds rows one after another in position order, so where the gathers fall
// does not change a bit of the result.
constexpr int64_t kGatherRows = 2 * kVBlock;

// f(rows): a block of n ≤ kVBlock K or V rows (d elements each) for `readers` query rows. An
// 8-bit row costs more to widen (about eight instructions per eight elements) than the dot
// products or the Σ e·V it feeds, so when more than one query row reads the block, f gets it
// widened once into f32 in `buf`; a row-quantized row (q8_0) is always widened. Widening is
// exact: the arithmetic after it, and its results, are the same bits. 16-bit rows widen in one
// instruction as they are read and go as they are.
template <typename T, typename F>
void ReadBlock(const T* const* rows, int64_t n, int64_t d, int64_t readers,
               std::vector<float>& buf, F&& f) {
  static_assert(!kRowQuantized<T> || sizeof(T) == 1, "a row-quantized type is stored as bytes");
  if constexpr (sizeof(T) == 1) {
    if (kRowQuantized<T> || readers > 1) {
      CHECK(n <= kVBlock);
      buf.resize(n * d);
      const float* widened[kVBlock];
      for (int64_t u = 0; u < n; ++u) {
        WidenRow(rows[u], d, buf.data() + u * d);
        widened[u] = buf.data() + u * d;
      }
      f(widened);
      return;
    }
  }
  if constexpr (!kRowQuantized<T>) f(rows);
}

// y[c] += Σ_{u < n} w[u] · x[u][c] for c < 8·NV, in u order (the same FMAs, in the same order,
// as Axpy row by row); y stays in registers across the rows.
template <int NV, typename T>
void AccumulateRows(const float* w, const T* const* x, int64_t n, float* y) {
#if TS_AVX2
  __m256 acc[NV];
  for (int u = 0; u < NV; ++u) acc[u] = _mm256_loadu_ps(y + 8 * u);
  for (int64_t k = 0; k < n; ++k) {
    const __m256 a = _mm256_set1_ps(w[k]);
    for (int u = 0; u < NV; ++u) acc[u] = _mm256_fmadd_ps(a, Load8(x[k] + 8 * u), acc[u]);
  }
  for (int u = 0; u < NV; ++u) _mm256_storeu_ps(y + 8 * u, acc[u]);
#else
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < 8 * NV; ++c) y[c] += w[k] * ToFloat(x[k][c]);
  }
#endif
}

// y[0, d) += Σ_{u < n} w[u] · x[u][0, d) for n ≤ kVBlock rows, in u order: 64 (then 16) columns
// at a time in registers, a scalar tail for d not a multiple of 16.
template <typename T>
void AccumulateBlock(const float* w, const T* const* x, int64_t n, int64_t d, float* y) {
  const T* xs[kVBlock];
  int64_t c = 0;
  for (; c + 64 <= d; c += 64) {
    for (int64_t k = 0; k < n; ++k) xs[k] = x[k] + c;
    AccumulateRows<8>(w, xs, n, y + c);
  }
  for (; c + 16 <= d; c += 16) {
    for (int64_t k = 0; k < n; ++k) xs[k] = x[k] + c;
    AccumulateRows<2>(w, xs, n, y + c);
  }
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t cc = c; cc < d; ++cc) y[cc] += w[k] * ToFloat(x[k][cc]);
  }
}

// A unit's query rows: tokens at positions first_pos .. first_pos + ntok - 1 of one sequence,
// the `group` query heads of one KV head each. Row r = i·group + h (token i, head h) attends to
// keys [0, first_pos + i].
struct Tile {
  int64_t first_pos, ntok, group;

  int64_t rows() const { return ntok * group; }
  int64_t keys() const { return first_pos + ntok; }  // the longest row
  int64_t RowLen(int64_t r) const { return first_pos + r / group + 1; }
  // The first row that sees key j (rows from there on all do).
  int64_t FirstRowSeeing(int64_t j) const { return std::max<int64_t>(0, j - first_pos) * group; }
  // Row r's offset in a [token, head, d] array whose tokens are `token_stride` apart.
  int64_t Offset(int64_t r, int64_t token_stride, int64_t d) const {
    return (r / group) * token_stride + (r % group) * d;
  }
};

// Scores of a tile's rows against keys [j_begin, j_end) (j_begin a multiple of four, j_end ≤
// tile.keys()): e[r·e_stride + j] = s_rj = q_r·k_j·scale for the keys row r sees, and
// row_max[r] = max(row_max[r], those). K rows are read once for the whole tile, four keys at a
// time. A score's arithmetic is the same whatever the tile or the range.
template <typename T>
void Scores(const SeqChunk& seq, int64_t lh, const Tile& tile, int64_t j_begin, int64_t j_end,
            int64_t d, float scale, const KvPoolLayout& layout, const T* kv_pool,
            const float* q,  // row r at q + tile.Offset(r, q_stride, d)
            int64_t q_stride, float* e, int64_t e_stride, float* row_max,
            std::vector<float>& widened) {
  constexpr int64_t kKeys = 4;
  const int32_t bs = layout.block_size;
  const int64_t rows = tile.rows();
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeys) {
    const T* kr[kKeys];
    for (int64_t u = 0; u < kKeys; ++u) {
      const int64_t j = std::min(j0 + u, j_end - 1);  // the last block repeats its final key
      kr[u] = kv_pool + layout.RowOffset(seq.pages.KPage(lh, j, bs), int32_t(j % bs));
    }
    const int64_t first_row = tile.FirstRowSeeing(j0);
    auto score = [&](const auto* const* keys) {
      for (int64_t r = first_row; r < rows; ++r) {
        float s[kKeys];
        Dot4(q + tile.Offset(r, q_stride, d), keys, d, s);
        const int64_t j1 = std::min({j0 + kKeys, j_end, tile.RowLen(r)});
        for (int64_t j = j0; j < j1; ++j) {
          const float x = s[j - j0] * scale;
          e[r * e_stride + j] = x;
          row_max[r] = std::max(row_max[r], x);
        }
      }
    };
    ReadBlock(kr, kKeys, d, rows - first_row, widened, score);
  }
}

// x[j] = exp(x[j] - m) for j < n, and returns Σ x[j] summed by key chunks: each chunk's sum in
// ExpShiftSum's order, the chunks' sums added in order (n ≤ kKeyChunk: ExpShiftSum itself).
// Chunks start at multiples of eight, so every element gets the bits ExpShiftSum over the whole
// row would give it.
inline float ChunkedExpShiftSum(float* x, int64_t n, float m) {
  float sum = ExpShiftSum(x, std::min(n, kKeyChunk), m);
  for (int64_t c = kKeyChunk; c < n; c += kKeyChunk) {
    sum += ExpShiftSum(x + c, std::min(kKeyChunk, n - c), m);
  }
  return sum;
}

// Pass 1 of attention for a tile: sizes e to [rows, keys] and writes e[r·keys + j] =
// exp(s_rj - max_r) for j < RowLen(r), with each row's max and Σe (ChunkedExpShiftSum). A
// row's own arithmetic is the same whatever the tile, so the results do not depend on how the
// tokens were tiled.
template <typename T>
void ExpScores(const SeqChunk& seq, int64_t lh, const Tile& tile, int64_t d, float scale,
               const KvPoolLayout& layout, const T* kv_pool,
               const float* q,  // row r at q + tile.Offset(r, q_stride, d)
               int64_t q_stride, std::vector<float>& e, float* row_max, float* denom,
               std::vector<float>& widened) {
  const int64_t rows = tile.rows();
  const int64_t L = tile.keys();
  e.resize(rows * L);
  std::fill(row_max, row_max + rows, -std::numeric_limits<float>::infinity());
  Scores(seq, lh, tile, 0, L, d, scale, layout, kv_pool, q, q_stride, e.data(), L, row_max,
         widened);
  for (int64_t r = 0; r < rows; ++r) {
    denom[r] = ChunkedExpShiftSum(e.data() + r * L, tile.RowLen(r), row_max[r]);
  }
}

// acc(r)[0, d) += Σ e[r·e_stride + j] · v_j over the keys j of [j_begin, j_end) that row r sees,
// in key order, for the rows from FirstRowSeeing(j_begin) on: kVBlock V rows at a time, each
// row's sum in registers across a block.
template <typename T, typename Acc>
void SumEV(const SeqChunk& seq, int64_t lh, const Tile& tile, int64_t j_begin, int64_t j_end,
           int64_t d, const KvPoolLayout& layout, const T* kv_pool, const float* e,
           int64_t e_stride, Acc&& acc, std::vector<float>& widened) {
  const int32_t bs = layout.block_size;
  const int64_t rows = tile.rows();
  const T* vr[kVBlock];
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kVBlock) {
    const int64_t n = std::min(kVBlock, j_end - j0);
    for (int64_t u = 0; u < n; ++u) {
      const int64_t j = j0 + u;
      vr[u] = kv_pool + layout.RowOffset(seq.pages.VPage(lh, j, bs), int32_t(j % bs));
    }
    const int64_t first_row = tile.FirstRowSeeing(j0);
    auto accumulate = [&](const auto* const* values) {
      for (int64_t r = first_row; r < rows; ++r) {
        const int64_t j1 = std::min(j0 + n, tile.RowLen(r));
        AccumulateBlock(e + r * e_stride + j0, values, j1 - j0, d, acc(r));
      }
    };
    ReadBlock(vr, n, d, rows - first_row, widened, accumulate);
  }
}

// Dense softmax attention for one unit (a tile as in ExpScores): pass 1, then Σ e·V by key
// chunks (the first into o, each later one into `part` and then added to o), then ÷ Σe.
template <typename T>
void DenseTile(const SeqChunk& seq, int64_t lh, const Tile& tile, int64_t d, float scale,
               const KvPoolLayout& layout, const T* kv_pool,
               const float* q,  // row r at q + tile.Offset(r, q_stride, d)
               int64_t q_stride,
               float* o,        // same layout as q
               Scratch<T>& scratch) {
  const int64_t rows = tile.rows();
  const int64_t L = tile.keys();  // e's row stride
  float row_max[kTileTokens * kMaxGroup], denom[kTileTokens * kMaxGroup];
  ExpScores(seq, lh, tile, d, scale, layout, kv_pool, q, q_stride, scratch.e, row_max, denom,
            scratch.widened);
  auto o_row = [&](int64_t r) { return o + tile.Offset(r, q_stride, d); };
  for (int64_t r = 0; r < rows; ++r) std::fill(o_row(r), o_row(r) + d, 0.0f);
  SumEV(seq, lh, tile, 0, std::min(L, kKeyChunk), d, layout, kv_pool, scratch.e.data(), L, o_row,
        scratch.widened);
  scratch.part.resize(rows * d);
  float* part = scratch.part.data();
  for (int64_t c0 = kKeyChunk; c0 < L; c0 += kKeyChunk) {
    const int64_t first_row = tile.FirstRowSeeing(c0);
    std::fill(part + first_row * d, part + rows * d, 0.0f);
    SumEV(seq, lh, tile, c0, std::min(L, c0 + kKeyChunk), d, layout, kv_pool, scratch.e.data(),
          L, [&](int64_t r) { return part + r * d; }, scratch.widened);
    for (int64_t r = first_row; r < rows; ++r) {
      float* out = o_row(r);
      for (int64_t c = 0; c < d; ++c) out[c] += part[r * d + c];
    }
  }
  for (int64_t r = 0; r < rows; ++r) Scale(1.0f / denom[r], o_row(r), d);
}

// Top-θ attention for one query token (position pos) of one KV group, after pass 1: e holds
// exp(s - max) of the group's rows ([group, e_stride], keys 0..pos), with their maxima and
// full denominators. The keep test per head, pass 2 over the stored V rows (the sparse and host
// stores merged in position order, then the tail) gathering only kept rows and setting hit
// bits, then SDC and VMC.
template <typename T>
void TopThetaRow(const SeqChunk& seq, int64_t layer, int64_t lh, int64_t pos, int64_t group,
                 int64_t first_head, const AttentionShape& shape, const KvPoolLayout& layout,
                 const T* kv_pool, const T* host_pool, const float* e, int64_t e_stride,
                 const float* row_max,
                 const float* d_full, const float* vsum, float* og, const TopThetaConfig& cfg,
                 Scratch<T>& scratch) {
  const int64_t d = shape.head_dim;
  const int64_t L = pos + 1;
  const int32_t bs = layout.block_size;
  const model::ThetaTable& table = *cfg.table;
  const int32_t k = table.KAt(static_cast<int32_t>(layer), L);
  const bool post = table.placement == model::ThetaPlacement::kPostSoftmax;

  // The keep test in exp space: keep_j ⇔ e_j > thr (exp is monotonic, so pre-softmax s_j > θ
  // is e_j > e^(θ-m), and post-softmax p_j > θ is e_j > θ·D_full). thr < 0 keeps everything.
  float thr[kMaxGroup];
  for (int64_t h = 0; h < group; ++h) {
    const int32_t head = static_cast<int32_t>(first_head + h);
    const float* eh = e + h * e_stride;
    if (L <= k) {
      thr[h] = -1.0f;  // short rows are dense
    } else if (cfg.top_k || cfg.recorder) {
      // Exact top-k: the threshold is the (k+1)-th largest value.
      scratch.sorted.assign(eh, eh + L);
      std::nth_element(scratch.sorted.begin(), scratch.sorted.begin() + k, scratch.sorted.end(),
                       std::greater<float>());
      thr[h] = scratch.sorted[k];
      if (cfg.recorder) {
        double kept = 0;
        for (int64_t j = 0; j < L; ++j) kept += eh[j] > thr[h] ? eh[j] : 0.0f;
        const float theta_row = post ? thr[h] / d_full[h] : row_max[h] + std::log(thr[h]);
        // ≥ 0: D_full is a float sum, and kept can exceed it by rounding when nearly all is kept.
        const float miss = kept > 0 ? static_cast<float>(std::max(0.0, (d_full[h] - kept) / kept)) : 0.0f;
        cfg.recorder->Record(static_cast<int32_t>(layer), head, L, theta_row, miss);
      }
    } else {
      const float theta = table.Theta(static_cast<int32_t>(layer), head, L);
      thr[h] = std::isnan(theta) ? -1.0f
               : post            ? theta * d_full[h]
                                 : std::exp(theta - row_max[h]);
    }
  }

  // Pass 2: walk the stored V rows, list the kept ones per head, and gather them (Σ e·V) every
  // kGatherRows rows read.
  std::fill(og, og + group * d, 0.0f);
  float d_kept[kMaxGroup] = {};
  int64_t kept[kMaxGroup] = {};    // rows each head kept
  int64_t listed[kMaxGroup] = {};  // ... of which not yet gathered
  int64_t rows_read = 0, host_reads = 0, evicted_hits = 0;
  int64_t pending = 0;  // rows read since the last gather
  // Marks and mass of positions from hits_begin on (kernels/paged_kv.h): entry j - mark_from.
  const int64_t mark_from = seq.pages.hits_begin;
  int32_t* hits = seq.pages.hits ? seq.pages.hits + lh * seq.pages.hits_stride : nullptr;
  float* hit_mass = seq.pages.hit_mass ? seq.pages.hit_mass + lh * seq.pages.hits_stride : nullptr;
  const float retain = cfg.retain_factor;
  // Each head's kept rows and weights since the last gather, in position order (a head lists
  // at most one row per row read).
  scratch.kept_rows.resize(group * kGatherRows);
  scratch.kept_e.resize(group * kGatherRows);
  const ReadRow<T>** kept_rows = scratch.kept_rows.data();
  float* kept_e = scratch.kept_e.data();
  // Row-quantized T: each V row some head keeps is widened once, into row `pending`.
  if constexpr (kRowQuantized<T>) scratch.kept_widened.resize(kGatherRows * d);
  auto gather = [&] {
    for (int64_t h = 0; h < group; ++h) {
      const int64_t base = h * kGatherRows;
      for (int64_t k0 = 0; k0 < listed[h]; k0 += kVBlock) {
        AccumulateBlock(kept_e + base + k0, kept_rows + base + k0,
                        std::min(kVBlock, listed[h] - k0), d, og + h * d);
      }
      listed[h] = 0;
    }
    pending = 0;
  };
  auto visit = [&](int64_t j, const T* vr, bool from_host = false) {
    bool any = false, strong = false;
    float mass = 0.0f;
    const ReadRow<T>* row = nullptr;
    if constexpr (kRowQuantized<T>) {
      row = scratch.kept_widened.data() + pending * d;
    } else {
      row = vr;
    }
    for (int64_t h = 0; h < group; ++h) {
      const float ej = e[h * e_stride + j];
      if (ej > thr[h]) {
        if (vr) {
          kept_rows[h * kGatherRows + listed[h]] = row;
          kept_e[h * kGatherRows + listed[h]] = ej;
          d_kept[h] += ej;
          ++listed[h];
          ++kept[h];
        }
        any = true;
        strong |= ej > retain * thr[h];
        mass += ej / d_full[h];
      }
    }
    if (!any) return;
    if (vr) {
      if constexpr (kRowQuantized<T>) WidenRow(vr, d, scratch.kept_widened.data() + pending * d);
      ++rows_read;
      host_reads += from_host;
      if (++pending == kGatherRows) gather();
    } else {
      ++evicted_hits;  // retained, but its V row was dropped: its mass stays in D_miss
    }
    if (j < mark_from) return;
    if (hit_mass) {
      std::atomic_ref<float>(hit_mass[j - mark_from]).fetch_add(mass, std::memory_order_relaxed);
    }
    if (hits && strong) {
      // Latest retaining query: several prefill queries may race for the same row.
      std::atomic_ref<int32_t> h(hits[j - mark_from]);
      int32_t seen = h.load(std::memory_order_relaxed);
      while (seen < pos && !h.compare_exchange_weak(seen, static_cast<int32_t>(pos),
                                                     std::memory_order_relaxed)) {
      }
    }
  };
  const int32_t tail_start = std::min<int32_t>(seq.pages.v_tail_start, static_cast<int32_t>(L));
  const int32_t sparse_n = seq.pages.SparseCount(lh);
  const int32_t* sparse_pos = sparse_n ? seq.pages.v_sparse_pos + lh * seq.pages.sparse_pos_stride : nullptr;
  const int32_t host_n = seq.pages.HostCount(lh);
  const int32_t* host_pos = host_n ? seq.pages.v_host_pos + lh * seq.pages.host_pos_stride : nullptr;
  int32_t r = 0, hr = 0;
  for (int64_t j = 0; j < tail_start; ++j) {
    if (r < sparse_n && sparse_pos[r] == j) {
      const int32_t page = seq.pages.v_sparse_pages[lh * seq.pages.sparse_stride + r / bs];
      visit(j, kv_pool + layout.RowOffset(page, r % bs));
      ++r;
    } else if (hr < host_n && host_pos[hr] == j) {
      const int32_t page = seq.pages.v_host_pages[lh * seq.pages.host_stride + hr / bs];
      visit(j, host_pool + layout.RowOffset(page, hr % bs), /*from_host=*/true);
      ++hr;
    } else {
      visit(j, nullptr);
    }
  }
  for (int64_t j = tail_start; j < L; ++j) {
    visit(j, kv_pool + layout.RowOffset(seq.pages.VPage(lh, j, bs), int32_t(j % bs)));
  }
  gather();

  // Compensation.
  const float inv_L = 1.0f / static_cast<float>(L);
  int64_t elements = 0;
  for (int64_t h = 0; h < group; ++h) {
    float* oh = og + h * d;
    float denom = d_kept[h];
    switch (cfg.sdc) {
      case SdcMode::kNone: break;
      case SdcMode::kExact: denom = d_full[h]; break;
      case SdcMode::kExpThreshold:
        if (thr[h] > 0) denom = d_kept[h] + float(L - kept[h]) * thr[h];
        break;
      case SdcMode::kOffline:
        if (thr[h] > 0) {
          denom = d_kept[h] * (1.0f + table.SdcRatio(static_cast<int32_t>(layer),
                                                     static_cast<int32_t>(first_head + h), L));
        }
        break;
    }
    const bool have_mean = cfg.vmc && vsum != nullptr;
    if (denom > 0) {
      Scale(1.0f / denom, oh, d);
      if (have_mean) {
        // VMC: the pruned probability mass goes to the mean of all V rows so far.
        const float missing = std::max(0.0f, 1.0f - d_kept[h] / denom);
        if (missing > 0) Axpy(missing * inv_L, vsum, oh, d);
      }
    } else if (have_mean) {
      for (int64_t c = 0; c < d; ++c) oh[c] = vsum[c] * inv_L;  // nothing kept: the mean
    }
    elements += kept[h];
  }
  AttentionStats& st = scratch.stats;
  st.v_rows_read += rows_read;
  st.v_rows_read_host += host_reads;
  st.v_rows_read_dense += L;
  st.elements_kept += elements;
  st.elements_dense += L * group;
  st.retained_but_evicted += evicted_hits;
  st.layer_kept[layer] += elements;
  st.layer_dense[layer] += L * group;
}

// Top-θ attention for one unit (a tile as in ExpScores): pass 1 for the whole tile, then each
// token's rows as TopThetaRow.
template <typename T>
void TopThetaTile(const SeqChunk& seq, int64_t layer, int64_t lh, const Tile& tile,
                  int64_t first_head, const AttentionShape& shape, const KvPoolLayout& layout,
                  const T* kv_pool, const T* host_pool,
                  const float* q,     // row r at q + tile.Offset(r, q_stride, head_dim)
                  int64_t q_stride,
                  const float* vsum,  // token i's running V sum at vsum + i * vsum_stride, or null
                  int64_t vsum_stride,
                  float* o,           // same layout as q
                  const TopThetaConfig& cfg, Scratch<T>& scratch) {
  const int64_t L = tile.keys(), group = tile.group;
  float row_max[kTileTokens * kMaxGroup], d_full[kTileTokens * kMaxGroup];
  ExpScores(seq, lh, tile, shape.head_dim, shape.scale, layout, kv_pool, q, q_stride, scratch.e,
            row_max, d_full, scratch.widened);
  for (int64_t i = 0; i < tile.ntok; ++i) {
    TopThetaRow(seq, layer, lh, tile.first_pos + i, group, first_head, shape, layout, kv_pool,
                host_pool, scratch.e.data() + i * group * L, L, row_max + i * group, d_full + i * group,
                vsum ? vsum + i * vsum_stride : nullptr, o + i * q_stride, cfg, scratch);
  }
}

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

// A decode unit (one token) whose row is at least four key chunks long (shorter rows cost
// less than the extra round of threads costs): the units PagedAttention may split.
constexpr int64_t kMinSplitKeys = 4 * kKeyChunk;
bool Splittable(const ForwardBatch& batch, const Unit& u) {
  return u.num_tokens == 1 && batch.seqs[u.seq].start_pos + u.token + 1 >= kMinSplitKeys;
}

// See SplitsDecodeRows (attention.h). kAuto: the units handed out whole, longest first, each to
// the thread that frees up first, would keep the busiest thread more than a fifth longer than
// an even share of the work, and the splittable units' scores fit the threads' score buffers.
bool ChooseSplit(const ForwardBatch& batch, const std::vector<Unit>& units, int64_t group,
                 int threads, DecodeSplit split) {
  if (split == DecodeSplit::kNever) return false;
  int64_t total = 0, score_floats = 0;
  for (const Unit& u : units) {
    total += UnitCost(batch, u);
    if (Splittable(batch, u)) score_floats += group * UnitCost(batch, u);
  }
  if (score_floats == 0) return false;  // no row long enough
  if (split == DecodeSplit::kAlways) return true;
  if (threads < 2 || score_floats > kMaxScoreFloats * threads) return false;
  // The threads' loads as the units (longest first) go whole to the least loaded.
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> loads;
  for (int t = 0; t < threads; ++t) loads.push(0);
  int64_t busiest = 0;
  for (const Unit& u : units) {
    const int64_t load = loads.top() + UnitCost(batch, u);
    loads.pop();
    loads.push(load);
    busiest = std::max(busiest, load);
  }
  return 5 * busiest * threads > 6 * total;
}

}  // namespace

bool SplitsDecodeRows(const ForwardBatch& batch, const AttentionShape& shape, int threads,
                      DecodeSplit split) {
  const int64_t group = shape.num_heads / shape.num_kv_heads;
  return ChooseSplit(batch, MakeUnits(batch, group, shape.num_kv_heads), group, threads, split);
}

template <typename T>
void PagedAttention(ThreadPool& pool, const ForwardBatch& batch, const AttentionShape& shape,
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
      thread_local Scratch<T> scratch;
      scratch.stats.Reset(shape.num_layers);
      for (int64_t i = begin; i < end; ++i) fn(i, scratch);
      if (batch.stats) {
        std::lock_guard<std::mutex> lock(stats_mu);
        batch.stats->Add(scratch.stats);
      }
    });
  };

  if (!ChooseSplit(batch, units, group, pool.num_threads(), split)) {
    parallel(int64_t(units.size()), [&](int64_t u, Scratch<T>& scratch) { run_unit(units[u], scratch); });
    return;
  }

  // Flash-decoding: the long decode rows are worked a key chunk at a time, in two rounds:
  // (1) scores and each chunk's row maxima (the other units whole, meanwhile), (2) exp against
  // the row max, each chunk's Σe and (dense) Σ e·V; the thread that ends a unit's last chunk
  // adds the chunks' sums in order, then ÷ Σe (dense) or does Top-θ's pass 2. The arithmetic is DenseTile's and TopThetaTile's
  // (kKeyChunk), so the bits are the same as one thread working each unit whole.
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
    std::vector<float> e, max, sum, ev;
  };
  thread_local Buffers buffers;
  std::vector<float>& e_all = buffers.e;        // each split unit's scores, then exps
  std::vector<float>& chunk_max = buffers.max;  // [chunk, group] the chunk's row maxima
  std::vector<float>& chunk_sum = buffers.sum;  // [chunk, group] its Σe
  std::vector<float>& chunk_ev = buffers.ev;    // [chunk, group, d] its Σ e·V (dense)
  e_all.resize(e_floats);
  chunk_max.resize(num_chunks * group);
  chunk_sum.resize(num_chunks * group);
  if (!theta) chunk_ev.resize(num_chunks * group * d);
  // Row r's max over the chunks, folded in chunk order as the whole row's keys would be.
  auto row_max = [&](const Split& sp, int64_t r) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c * kKeyChunk < sp.L; ++c) {
      m = std::max(m, chunk_max[(sp.first_chunk + c) * group + r]);
    }
    return m;
  };

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
  // A unit's sums, once its last chunk has had round 2.
  auto finish = [&](const Split& sp, Scratch<T>& scratch) {
    const At a = at(*sp.unit);
    float mx[kMaxGroup], denom[kMaxGroup];
    for (int64_t r = 0; r < group; ++r) {
      mx[r] = row_max(sp, r);
      denom[r] = chunk_sum[sp.first_chunk * group + r];
      for (int64_t c = 1; c * kKeyChunk < sp.L; ++c) {
        denom[r] += chunk_sum[(sp.first_chunk + c) * group + r];
      }
    }
    if (theta) {
      TopThetaRow(*a.seq, layer, a.lh, a.pos, group, sp.unit->kv_head * group, shape, layout,
                  kv_pool, host_pool, e_all.data() + sp.e, sp.L, mx, denom, a.vsum, a.o, config,
                  scratch);
      return;
    }
    for (int64_t r = 0; r < group; ++r) {
      float* out = a.o + r * d;
      const float* ev = chunk_ev.data() + sp.first_chunk * group * d + r * d;
      std::copy(ev, ev + d, out);
      for (int64_t c = 1; c * kKeyChunk < sp.L; ++c) {
        const float* part = ev + c * group * d;
        for (int64_t x = 0; x < d; ++x) out[x] += part[x];
      }
      Scale(1.0f / denom[r], out, d);
    }
    CountDense(scratch.stats, layer, group, 1, a.pos);
  };
  std::vector<std::atomic<int32_t>> chunks_left(splits.size());
  for (size_t s = 0; s < splits.size(); ++s) {
    chunks_left[s].store(int32_t((splits[s].L + kKeyChunk - 1) / kKeyChunk), std::memory_order_relaxed);
  }
  parallel(num_chunks, [&](int64_t i, Scratch<T>& scratch) {
    const auto [s, c] = chunks[i];
    const Split& sp = splits[s];
    const At a = at(*sp.unit);
    const int64_t c0 = c * kKeyChunk, c1 = std::min(sp.L, c0 + kKeyChunk);
    float* e = e_all.data() + sp.e;
    const int64_t k = sp.first_chunk + c;
    for (int64_t r = 0; r < group; ++r) {
      chunk_sum[k * group + r] = ExpShiftSum(e + r * sp.L + c0, c1 - c0, row_max(sp, r));
    }
    if (!theta) {
      float* ev = chunk_ev.data() + k * group * d;
      std::fill(ev, ev + group * d, 0.0f);
      SumEV(*a.seq, a.lh, Tile{a.pos, 1, group}, c0, c1, d, layout, kv_pool, e, sp.L,
            [&](int64_t r) { return ev + r * d; }, scratch.widened);
    }
    // The thread that does a unit's last chunk finishes it (acq_rel: it sees the others').
    if (chunks_left[s].fetch_sub(1, std::memory_order_acq_rel) == 1) finish(sp, scratch);
  });
}

#define THETASERVE_KV_ELEMENT(T)                                                          \
  template void WriteKv<T>(const ForwardBatch&, const AttentionShape&, int64_t, const float*, \
                           const float*, const KvPoolLayout&, T*, float*);                  \
  template void PagedAttention<T>(ThreadPool&, const ForwardBatch&, const AttentionShape&,   \
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
