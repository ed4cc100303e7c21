// Host-side launchers of the CUDA kernels. Plain C++ (no CUDA syntax) so the backend and the
// GPU tests, compiled by the host compiler, can call them. Every pointer is device memory;
// every launcher enqueues on `stream` and returns the launch error (cudaSuccess when queued).
// KV pages and GEMM operands are bf16, stored here as uint16_t bit patterns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include <cuda_runtime_api.h>

#include "kernels/paged_kv.h"
#include "kernels/top_theta.h"

namespace thetaserve::kernels::cuda {

using bf16 = uint16_t;

// A measuring knob (THETASERVE_ATTN_*) set to `value`, which names none of `known`: said on
// stderr, once per knob and value (a typo would otherwise measure the default unnoticed).
void WarnUnknownKnob(const char* var, const char* value, const char* known);

// A knob's values: each name and what it selects.
template <typename E>
struct KnobValue {
  const char* name;
  E value;
};

// The value environment variable `var` names among `values`; `fallback` where it is unset or
// empty, and (WarnUnknownKnob, listing the names in order) where it names none of them.
template <typename E, size_t N>
E KnobFromEnv(const char* var, const KnobValue<E> (&values)[N], E fallback) {
  const char* v = std::getenv(var);
  if (!v || !*v) return fallback;
  std::string known;
  for (const KnobValue<E>& k : values) {
    if (std::strcmp(v, k.name) == 0) return k.value;
    if (!known.empty()) known += '|';
    known += k.name;
  }
  WarnUnknownKnob(var, v, known.c_str());
  return fallback;
}

// The name of `value` among `values` ("?" for one not listed).
template <typename E, size_t N>
const char* KnobName(E value, const KnobValue<E> (&values)[N]) {
  for (const KnobValue<E>& k : values) {
    if (k.value == value) return k.name;
  }
  return "?";
}

// One sequence of a step, as the kernels see it: the SeqChunk fields with device page tables.
struct DevSeq {
  int32_t token_offset = 0;
  int32_t num_tokens = 0;
  int32_t start_pos = 0;
  SeqPageTables pages;  // device pointers (v_sum, hits: device copies)
};

// One token row of a step: its sequence and position.
struct DevRow {
  int32_t seq = 0;
  int32_t pos = 0;
};

struct AttnShape {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // 16, 32, 64 or 128
  float scale = 1.0f;
};

// Where one layer's K/V rows of a step are: the step's token rows and sequences (device
// copies: DeviceBatch), the attention shape, the layer and the pool's layout. The pool goes
// beside it: bf16* to the launcher that writes K and V, const bf16* to those that read them;
// every `pool` and `host_pool` argument below is [num_pages, block_size, head_dim] bf16,
// addressed by layout.RowOffset.
struct DevKv {
  const DevRow* rows = nullptr;  // [T]: the step's token rows
  const DevSeq* seqs = nullptr;  // [num_seqs]
  AttnShape shape;
  int32_t layer = 0;
  KvPoolLayout layout;
};

// The step's query rows: q [T, stride] f32, query heads from column 0 (the rows of qkv).
struct DevQueries {
  const float* data = nullptr;
  int64_t stride = 0;
};

// out[t] = table[tokens[t]] (bf16 -> f32); table [vocab, hidden], out [T, hidden].
cudaError_t LaunchEmbed(const bf16* table, const int32_t* tokens, int64_t T, int64_t hidden,
                        float* out, cudaStream_t stream);

// y[t] = x[t] / rms(x[t]) * w; `rows` (optional) picks the input rows: y[i] from x[rows[i]].
cudaError_t LaunchRmsNormBf16(const float* x, const int32_t* rows, const float* w, int64_t T,
                              int64_t n, float eps, bf16* y, cudaStream_t stream);
cudaError_t LaunchRmsNormF32(const float* x, const int32_t* rows, const float* w, int64_t T,
                             int64_t n, float eps, float* y, cudaStream_t stream);

// out[t, i] = silu(gu[t, i]) * gu[t, inter + i] (gate and up side by side).
cudaError_t LaunchSiluMul(const float* gu, int64_t T, int64_t inter, bf16* out,
                          cudaStream_t stream);

cudaError_t LaunchF32ToBf16(const float* x, int64_t n, bf16* y, cudaStream_t stream);

// qkv rows hold [q (num_heads·d) | k (num_kv_heads·d) | v (num_kv_heads·d)] in f32. Adds the
// bias (optional: one such row), rotates q and k at each row's position (inv_freq: [d/2]; pairs (2i, 2i+1)
// when interleaved, else (i, i + d/2)), writes K and V of kv.layer into their pages as bf16.
// q and k are rotated in place; v stays as computed.
cudaError_t LaunchRopeWriteKv(float* qkv, const float* bias, int64_t T, const DevKv& kv,
                              const float* inv_freq, bool interleaved, bf16* pool,
                              cudaStream_t stream);

// VMC's running V sums of kv.layer: adds each new V row (in token order within each of the
// num_seqs sequences kv.seqs) to its sequence's v_sum and writes each row's sum including
// itself to vsum_rows [T, kv_dim] (optional). Sequences without v_sum get nothing.
cudaError_t LaunchVSum(const float* qkv, const DevKv& kv, int32_t num_seqs, float* vsum_rows,
                       cudaStream_t stream);

// v_sum [tables, head_dim] = the sum of each table's V rows [0, length) in position order,
// read from the pool (bf16). v_pages [tables, ceil(length / block_size)]: each table's pages.
cudaError_t LaunchSumVRows(const int32_t* v_pages, int32_t tables, int64_t length,
                           const KvPoolLayout& layout, const bf16* pool, float* v_sum,
                           cudaStream_t stream);

// Copies KV rows in order (later copies may read what earlier ones wrote).
cudaError_t LaunchCopyKvRows(const KvRowCopy* copies, int32_t n, const KvPoolLayout& layout,
                             bf16* pool, cudaStream_t stream);

// Copies KV rows from the pool into the host pool (dst pages are host pages; `host_pool` is
// its device-visible address). The copies must be independent.
cudaError_t LaunchOffloadKvRows(const KvRowCopy* copies, int32_t n, const KvPoolLayout& layout,
                                const bf16* pool, bf16* host_pool, cudaStream_t stream);

// One copy into a sequence's page tables kept on the device (DeviceBatch): `rows` × `width`
// int32 from src[src_offset...] (rows back to back) to dst, row r at dst + r · dst_stride.
struct DevTableCopy {
  int32_t* dst;
  int64_t dst_stride;
  int64_t src_offset;
  int32_t width;
  int32_t rows;
};
// Runs n copies from `src` (the step's uploaded buffer); they write disjoint elements.
// `largest`: the most elements one copy moves.
cudaError_t LaunchTableCopies(const DevTableCopy* copies, int32_t n, int64_t largest,
                              const int32_t* src, cudaStream_t stream);

// out[r] = the greedy pick of logits row r ([rows, vocab] f32): the first index of the row's
// largest value, never a NaN's, 0 when no value is above -inf (as the host sampler's ArgMax).
cudaError_t LaunchArgmaxRows(const float* logits, int64_t rows, int64_t vocab, int32_t* out,
                            cudaStream_t stream);

// Fills n bf16 values with approximately N(0, scale²) noise from a counter-based hash of
// (seed, index): benchmarks fill gigabytes of K/V without a host round trip.
cudaError_t LaunchFillRandomBf16(bf16* p, int64_t n, uint64_t seed, float scale,
                                 cudaStream_t stream);

// Device arrays the attention kernels need; sized by AttentionWorkspace::Bytes.
struct AttentionWorkspace {
  float* part_o = nullptr;    // [rows, heads, max_splits, d]
  float* part_m = nullptr;    // [rows, heads, max_splits]
  float* part_l = nullptr;    // [rows, heads, max_splits] Σe over the split
  float* part_dk = nullptr;   // [rows, heads, max_splits] D_kept (Top-θ pass 2)
  float* part_n = nullptr;    // [rows, heads, max_splits] kept elements (Top-θ)
  float* row_stat = nullptr;  // [rows, heads, 3] m, D_full, threshold (Top-θ)
  uint16_t* scores = nullptr; // [rows, heads, score_stride] (Top-θ) (m_split − s)·4096
  int64_t score_stride = 0;
  int32_t max_splits = 0;
};

// How pass 1 of the split kernels reads K.
enum class KLoad : int32_t {
  kPerThread,  // a thread per key, its 16-byte loads straight into registers
  kStaged,     // tiles of keys copied into shared memory with cp.async, two threads per key
  kQuad,       // four threads per key, each a quarter of the row, added with shuffles
               // (staged and quad: head_dim 64 and 128; other sizes read per thread)
  kAuto,       // PlanSplits picks one of the above by the launch's size (kStagedFromKeys)
};
// THETASERVE_ATTN_K_LOAD=thread|staged|quad|auto; kAuto when unset (and, said once on stderr,
// for a value that is none of these).
KLoad DefaultKLoad();
// kAuto stages K from this many keys per KV head a launch (rows × their longest length) up
// and reads it per thread below: on the H200 (2026-12-04, docs/results.md) staged was the
// faster of the two at every point measured from 65,536 up (dense 32k × 8: 83 vs 95 µs, 128k ×
// 1: 72 vs 82 µs) and per thread at every point below (by 1–2 µs: 32k × 1, 4k × 8, 1k × 32).
constexpr int64_t kStagedFromKeys = 65536;
const char* KLoadName(KLoad k);

// How Top-θ's passes run: as two kernels (pass 2 after every block of pass 1); fused into one
// launch of thread block clusters (sm_90), a cluster of up to kMaxClusterBlocks blocks per
// (row, KV group), each taking several of the row's splits, that meet at a cluster barrier
// between the passes; or, for pre-softmax thresholds only, in one pass (SplitOnePass: a split
// keeps the keys whose scores pass θ and gathers their V rows itself, since no row-wide max or
// D_full decides a key). kAuto: one pass where the thresholds are pre-softmax and no sequence
// of the step records the retained mass (hit_mass, which needs D_full), two kernels otherwise
// (CudaAttention::Prepare resolves it; PlanSplits takes it as kSplit).
enum class ThetaPasses : int32_t { kSplit, kFused, kOnePass, kAuto };
// THETASERVE_ATTN_THETA=split|fused (two kernels, or fused, whatever the placement) or auto;
// kAuto when unset (and, said once on stderr, for another value). Fused is not yet measured on
// a GPU.
ThetaPasses DefaultThetaPasses();
constexpr unsigned kMaxClusterBlocks = 8;  // the portable cluster size

// How a step's attention is split: `chunk` keys per split (a multiple of 64, at most 1024, and
// small enough that pass 1's shared memory, or the one-pass kernel's, fits in 48 KB), how pass
// 1 reads K (never kAuto: PlanSplits resolves it), and whether Top-θ's passes run fused or in
// one pass (where `passes` asks for it).
struct SplitPlan {
  int32_t chunk = 1024;
  int32_t max_splits = 1;
  KLoad k_load = KLoad::kPerThread;
  bool fused = false;
  bool one_pass = false;
  // For the benchmark's time per kernel: launch only the first n kernels of the split path
  // (dense: pass 1, combine; Top-θ: pass 1, pass 2, combine; fused: the fused kernel,
  // combine; one pass: the one-pass kernel, combine), leaving the output unwritten; 0
  // launches them all.
  int32_t kernel_limit = 0;
};
SplitPlan PlanSplits(int64_t num_rows, const AttnShape& shape, int64_t max_len, int num_sms,
                     KLoad k_load, ThetaPasses passes = ThetaPasses::kSplit);

// Top-θ inputs of one layer. θ and the offline SDC ratio per (row, query head), computed by
// the host from the table at each row's length (NaN θ: keep everything).
struct ThetaArgs {
  const float* theta = nullptr;      // [rows, heads]
  const float* sdc_ratio = nullptr;  // [rows, heads] (offline SDC) or null
  int32_t k = 0;                     // rows with L <= k are dense
  bool post_softmax = true;
  SdcMode sdc = SdcMode::kExact;
  bool vmc = true;
  float retain_factor = 1.0f;        // hit marks only where e > retain_factor · threshold
  const float* vsum_rows = nullptr;  // [T, kv_dim] (VMC) or null
  // The host pool (the offload policy's V rows; mapped pinned memory), null without one.
  const bf16* host_pool = nullptr;
  // Counters of this layer (kThetaCounters): [0] V rows read, [1] elements kept, [2]
  // positions retained by any head of the group (stored or not), [3] of [0], rows read from
  // the host pool.
  unsigned long long* counters = nullptr;
};
constexpr int kThetaCounters = 4;

// Causal paged attention for the rows in `row_ids` (indices into the step's token rows),
// flash-decoding style: each row's keys are split into plan.chunk-sized pieces, then reduced.
// Dense when theta is null. o: [T, num_heads·d].
cudaError_t LaunchSplitAttention(const int32_t* row_ids, int32_t num_rows, const DevKv& kv,
                                 const bf16* pool, const DevQueries& q, const SplitPlan& plan,
                                 const AttentionWorkspace& ws, const ThetaArgs* theta, float* o,
                                 cudaStream_t stream);

// Tests: the score Top-θ pass 2 recomputes for rows near a threshold (ExactScore), which must
// equal pass 1's bit for bit: q_head · k_j · scale for every row of row_ids (at most 65,535),
// query head and position j < L, read from K the way `k_load` says pass 1 did, at
// out[(r · num_heads + head) · max_len + j]; NaN from L to max_len.
cudaError_t LaunchExactScores(const int32_t* row_ids, int32_t num_rows, const DevKv& kv,
                              const bf16* pool, const DevQueries& q, KLoad k_load,
                              int32_t max_len, float* out, cudaStream_t stream);

// One prefill tile: tokens [tok0, tok0 + ntok) of sequence `seq` (indices within its chunk).
struct PrefillTile {
  int32_t seq = 0;
  int32_t tok0 = 0;
  int32_t ntok = 0;
};
// How the tiled prefill kernel computes: on the tensor cores with its fragments in registers
// (kMma: PTX mma.sync and ldmatrix), or through CUDA's warp matrix functions with S and P·V
// passing through shared memory (kWmma), both with bf16 operands split in halves for f32
// accuracy and 64 query rows a tile; or with f32 FMAs (kFma; 32 rows).
enum class PrefillWay : int32_t { kMma, kWmma, kFma };
constexpr int kPrefillWays = 3;
const char* PrefillWayName(PrefillWay way);
// THETASERVE_ATTN_PREFILL=mma|wmma|fma; kMma when unset (and, said once on stderr, for another
// value).
PrefillWay DefaultPrefillWay();
// Query tokens per prefill tile for a GQA group size and way.
int32_t PrefillTileTokens(int32_t group, PrefillWay way);
// Whether the tiled prefill kernel supports this head_dim (64, 128); other sizes (16, 32)
// send prefill rows to the split kernels.
bool PrefillSupports(int32_t head_dim);

// Dense causal attention for prefill chunks, tiled with an online softmax: each block holds
// one tile's query rows of one KV head (tiles of PrefillTileTokens(group, way) tokens) and
// walks that sequence's K/V pages 64 rows (mma, wmma) or 32 rows (fma) at a time. kv.rows is
// not read. tiles [num_tiles]; o [T, num_heads·head_dim], by token.
cudaError_t LaunchPrefillAttention(const PrefillTile* tiles, int32_t num_tiles, const DevKv& kv,
                                   const bf16* pool, const DevQueries& q, PrefillWay way,
                                   float* o, cudaStream_t stream);

// How Top-θ attends for a prompt chunk's rows: in tiles on the tensor cores (kTiled,
// LaunchPrefillThetaAttention), or a row at a time through the split kernels, as decode rows
// are (kSplit).
enum class ThetaPrefill : int32_t { kTiled, kSplit };
const char* ThetaPrefillName(ThetaPrefill way);
// THETASERVE_ATTN_THETA_PREFILL=tiled|split; kTiled when unset (and, said once on stderr, for
// another value).
ThetaPrefill DefaultThetaPrefill();

// Top-θ causal attention for prefill chunks (head_dim 64 or 128; group ≤ 64), tiled as the mma
// prefill kernel is (tiles of PrefillTileTokens(group, kMma) tokens): two walks over a tile's
// keys, the first for each row's max and D_full, the second for the keep test against the
// row's threshold, Σ e·V over the kept keys whose V rows are stored (tail, sparse or host
// store), hit marks, retained mass and the counters, as the split kernels set them; SDC and
// VMC at the end. kv.rows is not read. tiles and o as LaunchPrefillAttention's.
cudaError_t LaunchPrefillThetaAttention(const PrefillTile* tiles, int32_t num_tiles,
                                        const DevKv& kv, const bf16* pool, const DevQueries& q,
                                        const ThetaArgs& theta, float* o, cudaStream_t stream);

// Tests: the warp-wide instructions the mma prefill kernel is built on (warp_mma.cuh), alone,
// with the layouts that header writes down, in one warp: A (16×16) times B (16×16, two tiles
// of 8 columns) plus C, with A's fragments and B's read by ldmatrix as the kernel reads Q and
// K (B given as its transpose's rows, bt) and as it reads V (B's own rows, b, through .trans).
// Row-major 16×16 throughout; d: [2][16×16], the product from bt, then from b.
cudaError_t LaunchWarpMmaProbe(const bf16* a, const bf16* bt, const bf16* b, const float* c,
                               float* d, cudaStream_t stream);

}  // namespace thetaserve::kernels::cuda
