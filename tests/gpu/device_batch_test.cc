// DeviceBatch: what a step copies to the device and back. The plan needs no device (these
// tests run everywhere: the retained page tables are checked by applying the planned copies
// to host arrays); the round trips through device memory skip without one.
#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <vector>

#include "cache/page_pool.h"
#include "cache/sequence_kv.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/device_batch.h"
#include "scheduler/sequence.h"
#include "tests/gpu/gpu_test_util.h"

namespace thetaserve::kernels::cuda {
namespace {

// SmolLM2's cache shape: 30 layers × 3 KV heads, head_dim 64, 16-row pages.
constexpr int32_t kTables = 90, kHeadDim = 64, kBlock = 16;
const KvPoolLayout kLayout{kBlock, kHeadDim, 0};

// One decode sequence at `pos` with the host arrays the engine keeps: page tables sized for
// `capacity` positions, marks and mass for every position, V sums.
struct HostSeq {
  explicit HostSeq(int32_t pos, int32_t capacity)
      : pos(pos),
        stride(capacity / kBlock),
        k(size_t(kTables) * stride),
        v(size_t(kTables) * stride),
        hits(size_t(kTables) * capacity, -1),
        mass(size_t(kTables) * capacity, 0),
        v_sum(size_t(kTables) * kHeadDim, 0.0f) {
    std::iota(k.begin(), k.end(), 0);
    std::iota(v.begin(), v.end(), int32_t(k.size()));
  }
  // The chunk as PageTablesFor (scheduler/sequence.h) makes it: marks or mass from `begin`.
  SeqChunk Chunk(int32_t begin, bool with_hits, bool with_mass) {
    SeqChunk c;
    c.num_tokens = 1;
    c.start_pos = pos;
    c.pages.k_pages = k.data();
    c.pages.v_pages = v.data();
    c.pages.stride = stride;
    c.pages.v_tail_start = begin;
    c.pages.v_sum = v_sum.data();
    c.pages.hits_stride = stride * kBlock;
    c.pages.hits_begin = begin;
    if (with_hits) c.pages.hits = hits.data() + begin;
    if (with_mass) c.pages.hit_mass = mass.data() + begin;
    return c;
  }
  int32_t pos, stride;
  std::vector<int32_t> k, v, hits;
  std::vector<MassUnits> mass;
  std::vector<float> v_sum;
};

size_t Round16(size_t n) { return (n + 15) / 16 * 16; }

TEST(DeviceBatchTest, CopiesOnlyTheMarkWindowNotTheContext) {
  // A 32k-token sequence whose tail starts 272 rows back (a 256-row window and a block).
  const int32_t pos = 32767, begin = 32768 - 272;
  HostSeq seq(pos, 32768 + 2048);
  const std::vector<int32_t> tokens = {7};
  const size_t vsum = size_t(kTables) * kHeadDim * sizeof(float);
  const size_t tables = 2 * Round16(size_t(kTables) * seq.stride * sizeof(int32_t));
  const size_t window = size_t(kTables) * (pos + 1 - begin) * sizeof(int32_t);
  // The retained mass is 64-bit fixed point (kernels/paged_kv.h): twice a mark's bytes.
  const size_t mass_window = size_t(kTables) * (pos + 1 - begin) * sizeof(MassUnits);
  const size_t fixed = 16 + Round16(sizeof(DevRow)) + Round16(sizeof(DevSeq)) + tables + vsum;

  DeviceBatch db;
  {  // recency rule: marks only
    const std::vector<SeqChunk> seqs = {seq.Chunk(begin, true, false)};
    const size_t up = db.Plan(ForwardBatch{tokens, seqs}, kTables, kLayout, true);
    EXPECT_EQ(up, fixed + Round16(window));
    EXPECT_EQ(db.download_bytes(), vsum + window);
    const SeqPageTables& d = db.host_seqs()[0].pages;
    EXPECT_EQ(d.hits_stride, pos + 1 - begin) << "a device table row is the window";
    EXPECT_EQ(d.hits_begin, begin);
  }
  {  // mass budget: mass only
    const std::vector<SeqChunk> seqs = {seq.Chunk(begin, false, true)};
    EXPECT_EQ(db.Plan(ForwardBatch{tokens, seqs}, kTables, kLayout, true),
              fixed + Round16(mass_window));
    EXPECT_EQ(db.download_bytes(), vsum + mass_window);
  }
  {  // the policy reads neither (full V): V sums only
    const std::vector<SeqChunk> seqs = {seq.Chunk(begin, false, false)};
    EXPECT_EQ(db.Plan(ForwardBatch{tokens, seqs}, kTables, kLayout, true), fixed);
    EXPECT_EQ(db.download_bytes(), vsum);
  }
  {  // dense attention writes no marks: they stay on the host
    const std::vector<SeqChunk> seqs = {seq.Chunk(begin, true, true)};
    EXPECT_EQ(db.Plan(ForwardBatch{tokens, seqs}, kTables, kLayout, false), fixed);
    EXPECT_EQ(db.download_bytes(), vsum);
  }
  {  // marks over the whole context, as every step copied them before the window: 11.8 MB
     // each way per sequence at 32k
    const std::vector<SeqChunk> seqs = {seq.Chunk(0, true, false)};
    db.Plan(ForwardBatch{tokens, seqs}, kTables, kLayout, true);
    EXPECT_EQ(db.download_bytes(), vsum + size_t(kTables) * (pos + 1) * sizeof(int32_t));
  }
}

// Expects a copy of a row store (pages [tables, page_stride], positions [tables, pos_stride])
// to hold every entry a kernel may read.
void ExpectStoreHolds(const int32_t* count, const int32_t* want_pages, int32_t page_stride,
                      const int32_t* want_pos, int32_t pos_stride, int32_t tables,
                      const std::vector<int32_t>& pages, const std::vector<int32_t>& pos,
                      const std::string& what) {
  for (int32_t t = 0; t < tables; ++t) {
    const int32_t n = count[t];
    for (int32_t i = 0; i < n; ++i) {
      ASSERT_EQ(pos[size_t(t) * pos_stride + i], want_pos[size_t(t) * pos_stride + i])
          << what << ": position " << i << " of table " << t;
    }
    for (int32_t i = 0; i < (n + kBlock - 1) / kBlock; ++i) {
      ASSERT_EQ(pages[size_t(t) * page_stride + i], want_pages[size_t(t) * page_stride + i])
          << what << ": page " << i << " of table " << t;
    }
  }
}

// Expects copies of `kv`'s tables (K and V [tables, stride]; the sparse store's pages and
// positions, when it has any; the host store's, when `hp` is given) to hold every entry a
// kernel may read.
void ExpectTablesHold(const cache::SequenceKv& kv, int32_t tables, const std::vector<int32_t>& k,
                      const std::vector<int32_t>& v, const std::vector<int32_t>* sp,
                      const std::vector<int32_t>* pos, const std::string& what,
                      const std::vector<int32_t>* hp = nullptr,
                      const std::vector<int32_t>* hpos = nullptr) {
  if (hp) {
    ASSERT_TRUE(kv.has_host_store());
    ExpectStoreHolds(kv.host_count(), kv.host_pages(), kv.host_stride(), kv.host_pos(),
                     kv.host_pos_stride(), tables, *hp, *hpos, what + ", host store");
  }
  const int64_t stride = kv.stride();
  const int64_t v_blocks = kv.blocks() - kv.v_tail_start() / kBlock;
  for (int32_t t = 0; t < tables; ++t) {
    for (int64_t b = 0; b < kv.blocks(); ++b) {
      ASSERT_EQ(k[t * stride + b], kv.k_table()[t * stride + b]) << what << ": K table " << t << " block " << b;
    }
    for (int64_t b = 0; b < v_blocks; ++b) {
      ASSERT_EQ(v[t * stride + b], kv.v_table()[t * stride + b]) << what << ": V table " << t << " block " << b;
    }
  }
  if (kv.sparse_stride() == 0) return;
  ExpectStoreHolds(kv.sparse_count(), kv.sparse_pages(), kv.sparse_stride(), kv.sparse_pos(),
                   kv.pos_stride(), tables, *sp, *pos, what + ", sparse store");
}

// The device's copies of page tables, kept on the host: a plan's allocations and copies
// applied to plain arrays, as LaunchTableCopies applies them on the device.
class HostTables {
 public:
  using Array = DeviceBatch::Array;
  void Apply(const DeviceBatch& db, size_t bytes) {
    std::vector<uint8_t> staging(bytes);
    db.FillStaging(staging.data());
    for (const auto& a : db.table_allocs()) arrays_[{a.id, a.array}].assign(a.elems, kPoison);
    for (const auto& c : db.table_copies()) {
      auto it = arrays_.find({c.id, c.array});
      ASSERT_NE(it, arrays_.end()) << "a copy into an array that was never allocated";
      std::vector<int32_t>& dst = it->second;
      ASSERT_LE(c.src + size_t(c.width) * c.rows * sizeof(int32_t), bytes);
      const int32_t* src = reinterpret_cast<const int32_t*>(staging.data() + c.src);
      for (int32_t r = 0; r < c.rows; ++r) {
        for (int32_t e = 0; e < c.width; ++e) {
          const size_t at = c.dst + size_t(r) * c.dst_stride + e;
          ASSERT_LT(at, dst.size()) << "a copy past its array";
          dst[at] = src[size_t(r) * c.width + e];
        }
      }
    }
  }
  // Forgets the copies of other sequences, as the plan does.
  void KeepOnly(const std::set<uint64_t>& ids) {
    std::erase_if(arrays_, [&](const auto& kv) { return !ids.count(kv.first.first); });
  }
  int64_t num_ids() const {
    std::set<uint64_t> ids;
    for (const auto& kv : arrays_) ids.insert(kv.first.first);
    return static_cast<int64_t>(ids.size());
  }
  // Expects the copy of `kv`'s tables to hold every entry a kernel may read.
  void ExpectHolds(const cache::SequenceKv& kv, int32_t tables, const std::string& what) const {
    const bool sparse = kv.sparse_stride() > 0;
    const bool host = kv.has_host_store();
    ExpectTablesHold(kv, tables, arrays_.at({kv.id(), Array::kK}), arrays_.at({kv.id(), Array::kV}),
                     sparse ? &arrays_.at({kv.id(), Array::kSparsePages}) : nullptr,
                     sparse ? &arrays_.at({kv.id(), Array::kSparsePos}) : nullptr, what,
                     host ? &arrays_.at({kv.id(), Array::kHostPages}) : nullptr,
                     host ? &arrays_.at({kv.id(), Array::kHostPos}) : nullptr);
  }

 private:
  static constexpr int32_t kPoison = -777;
  std::map<std::pair<uint64_t, Array>, std::vector<int32_t>> arrays_;
};

// Reads `n` int32 from device memory.
std::vector<int32_t> FromDevice(const int32_t* p, size_t n) {
  std::vector<int32_t> out(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(out.data(), p, n * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return out;
}

// Expects the device's tables of a step's sequence (`d`: its device pointers) to hold every
// entry of `kv`'s tables that a kernel may read.
void ExpectDeviceHolds(const SeqPageTables& d, const cache::SequenceKv& kv, int32_t tables,
                       const std::string& what) {
  const size_t stride = kv.stride();
  const bool sparse = kv.sparse_stride() > 0;
  const std::vector<int32_t> sp =
      sparse ? FromDevice(d.v_sparse_pages, size_t(tables) * kv.sparse_stride()) : std::vector<int32_t>();
  const std::vector<int32_t> pos =
      sparse ? FromDevice(d.v_sparse_pos, size_t(tables) * kv.pos_stride()) : std::vector<int32_t>();
  const bool host = kv.has_host_store();
  const std::vector<int32_t> hp =
      host ? FromDevice(d.v_host_pages, size_t(tables) * kv.host_stride()) : std::vector<int32_t>();
  const std::vector<int32_t> hpos =
      host ? FromDevice(d.v_host_pos, size_t(tables) * kv.host_pos_stride()) : std::vector<int32_t>();
  ExpectTablesHold(kv, tables, FromDevice(d.k_pages, tables * stride),
                   FromDevice(d.v_pages, tables * stride), &sp, &pos, what + " (device)",
                   host ? &hp : nullptr, host ? &hpos : nullptr);
  if (host) {
    const std::vector<int32_t> count = FromDevice(d.v_host_count, tables);
    for (int32_t t = 0; t < tables; ++t) {
      ASSERT_EQ(count[t], kv.host_count()[t]) << what << ": device host count of table " << t;
    }
  }
  if (!sparse) return;
  const std::vector<int32_t> count = FromDevice(d.v_sparse_count, tables);
  for (int32_t t = 0; t < tables; ++t) {
    ASSERT_EQ(count[t], kv.sparse_count()[t]) << what << ": device sparse count of table " << t;
  }
}

// Sequences go through the engine's life: chunked prefill, decoding (with compaction after
// every step under the sparse policy), growing strides, a preemption (all pages released, then
// recomputed) and a finish. After every step the retained copies hold exactly what the host
// tables hold, and a decode step that adds no block and follows no compaction sends no table
// entries. With a device the copies also run there and its tables are read back. Parameter:
// the V policy (full: every V row stays, in the tail; sparse; offload: the host store too).
enum class VPolicy { kFull, kSparse, kOffload };
void PrintTo(VPolicy p, std::ostream* os) {
  *os << (p == VPolicy::kFull ? "full" : p == VPolicy::kSparse ? "sparse" : "offload");
}
class RetainedTablesTest : public ::testing::TestWithParam<VPolicy> {};

TEST_P(RetainedTablesTest, FollowSequencesThroughTheirLife) {
  const cache::KvShape shape{/*num_layers=*/2, /*num_kv_heads=*/3, kBlock, /*head_dim=*/8};
  const int32_t tables = static_cast<int32_t>(shape.tables());
  const KvPoolLayout layout{kBlock, 8, 0};
  cache::SparsePolicy policy;
  policy.enabled = GetParam() != VPolicy::kFull;
  policy.offload = GetParam() == VPolicy::kOffload;
  policy.local_window = 32;
  policy.sink_tokens = 4;
  policy.obs_window = 8;
  cache::PagePool pool(20000, kBlock), host(20000, kBlock);
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("THETASERVE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);

  struct Seq {
    std::unique_ptr<cache::SequenceKv> kv;
    int64_t len = 0, target = 0;  // computed tokens; tokens to reach before decoding alone
    bool compacted = false;       // the last step's compaction moved the tail
  };
  std::vector<Seq> seqs(3);
  for (Seq& s : seqs) s.kv = std::make_unique<cache::SequenceKv>(shape);
  seqs[0].target = 50;
  seqs[1].target = 40;
  seqs[2].target = 70;
  const bool device = DeviceCount() > 0;
  DeviceBatch db;
  HostTables copies;
  int64_t sent = 0, whole = 0, quiet_steps = 0, offloaded = 0;
  std::map<uint64_t, int> last_used;  // id -> the last step a sequence with it ran
  const std::vector<int32_t> tokens(3 * 24, 1);
  for (int step = 0; step < 400; ++step) {
    // Sequence 1 is preempted at step 150 (all pages released, recomputed from the start);
    // sequence 0 finishes at step 300 and leaves the batch; sequence 2 joins at step 20.
    if (step == 150) {
      seqs[1].kv->ReleaseAll(pool);
      seqs[1].target = seqs[1].len;
      seqs[1].len = 0;
    }
    // Sequence 2 also sits out steps 100 and 101 (as when the token budget runs out).
    std::vector<Seq*> active;
    for (int i = 0; i < 3; ++i) {
      if ((i == 0 && step >= 300) || (i == 2 && (step < 20 || step == 100 || step == 101))) continue;
      active.push_back(&seqs[i]);
    }
    std::vector<SeqChunk> chunks;
    std::vector<bool> quiet;
    int32_t offset = 0;
    for (Seq* s : active) {
      const int64_t n = s->len < s->target ? std::min<int64_t>(24, s->target - s->len) : 1;
      ASSERT_TRUE(pool.CanAllocate(s->kv->PagesNeeded(s->len + n)));
      s->kv->Grow(pool, s->len + n);
      SeqChunk c;
      c.num_tokens = static_cast<int32_t>(n);
      c.start_pos = static_cast<int32_t>(s->len);
      c.token_offset = offset;
      offset += c.num_tokens;
      c.pages = scheduler::PageTablesFor(*s->kv, policy);
      c.tables = scheduler::TableVersionOf(*s->kv);
      chunks.push_back(c);
      quiet.push_back(n == 1 && s->len % kBlock != 0 && !s->compacted);
    }
    // With a device, Upload (which plans) also runs the copies there.
    const ForwardBatch batch{std::span(tokens).first(offset), chunks};
    if (device) {
      ASSERT_TRUE(db.Upload(batch, tables, layout, nullptr, true).ok());
      CUDA_ASSERT(cudaDeviceSynchronize());
    } else {
      db.Plan(batch, tables, layout, true);
    }
    copies.Apply(db, db.upload_bytes());
    // Copies stay for kRetainSteps steps without use, then go.
    for (Seq* s : active) last_used[s->kv->id()] = step;
    std::set<uint64_t> ids;
    for (const auto& [id, last] : last_used) {
      if (uint64_t(step - last) <= DeviceBatch::kRetainSteps) ids.insert(id);
    }
    copies.KeepOnly(ids);
    EXPECT_EQ(db.num_retained(), int64_t(ids.size())) << "step " << step;
    EXPECT_EQ(copies.num_ids(), int64_t(ids.size())) << "step " << step;
    if (step == 102) {
      for (const auto& a : db.table_allocs()) {
        EXPECT_NE(a.id, seqs[2].kv->id()) << "a sequence back after two steps was sent anew";
      }
    }
    for (size_t i = 0; i < active.size(); ++i) {
      Seq* s = active[i];
      const std::string what = "step " + std::to_string(step) + ", position " + std::to_string(s->len);
      copies.ExpectHolds(*s->kv, tables, what);
      if (device) ExpectDeviceHolds(db.host_seqs()[i].pages, *s->kv, tables, what);
      if (::testing::Test::HasFatalFailure()) return;
      int64_t entries = 0;
      for (const auto& c : db.table_copies()) {
        if (c.id == s->kv->id()) entries += int64_t(c.width) * c.rows;
      }
      sent += entries;
      whole += 2 * int64_t(tables) * s->kv->stride() +
               int64_t(tables) * (s->kv->sparse_stride() + s->kv->pos_stride() +
                                  s->kv->host_stride() + s->kv->host_pos_stride());
      if (quiet[i]) {
        ++quiet_steps;
        EXPECT_EQ(entries, 0) << what << ": a quiet decode step sent table entries";
      }
    }
    // The step ran: attention marks some tail rows as retained by the newest query, then
    // the engine compacts.
    for (size_t i = 0; i < active.size(); ++i) {
      Seq* s = active[i];
      const int64_t end = s->len + chunks[i].num_tokens;
      for (int32_t t = 0; t < tables; ++t) {
        for (int64_t p = s->kv->v_tail_start(); p < end; ++p) {
          if (rng() % 4 == 0) s->kv->hits()[t * s->kv->hits_stride() + p] = int32_t(end - 1);
        }
      }
      s->len = end;
      std::vector<cache::RowMove> moves;
      cache::SequenceKv::CompactResult r;
      const int64_t tail_before = s->kv->v_tail_start();
      s->kv->CompactV(pool, s->len, policy, &moves, &r, &host);
      offloaded += r.rows_offloaded;
      s->compacted = s->kv->v_tail_start() != tail_before;
    }
  }
  EXPECT_GT(quiet_steps, 500);
  EXPECT_EQ(offloaded > 0, GetParam() == VPolicy::kOffload);
  // Whole tables every step would have sent `whole` entries.
  EXPECT_LT(sent * 20, whole) << "sent " << sent << " of " << whole << " table entries";
  for (Seq& s : seqs) s.kv->ReleaseAll(pool);
  EXPECT_EQ(host.num_free(), host.num_pages());
}

INSTANTIATE_TEST_SUITE_P(Policies, RetainedTablesTest,
                         ::testing::Values(VPolicy::kSparse, VPolicy::kFull, VPolicy::kOffload),
                         [](const auto& info) {
                           return info.param == VPolicy::kFull     ? "FullV"
                                  : info.param == VPolicy::kSparse ? "SparseV"
                                                                   : "OffloadV";
                         });

TEST(DeviceBatchTest, MarksAndMassRoundTripThroughTheirWindowOnly) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int32_t pos = 700, begin = 512;
  HostSeq seq(pos, 1024);
  const int32_t capacity = seq.stride * kBlock;
  for (size_t i = 0; i < seq.hits.size(); ++i) {
    seq.hits[i] = int32_t(i % 1000);
    seq.mass[i] = MassUnits(i % 997) << 31;
  }
  const std::vector<int32_t> hits0 = seq.hits;
  const std::vector<MassUnits> mass0 = seq.mass;
  const std::vector<int32_t> tokens = {7};
  const std::vector<SeqChunk> seqs = {seq.Chunk(begin, true, true)};
  DeviceBatch db;
  ASSERT_TRUE(db.Upload(ForwardBatch{tokens, seqs}, kTables, kLayout, nullptr, true).ok());
  // The host changes everything after the upload; the download must restore exactly the
  // window [begin, pos] of every table from the device copy and leave the rest alone.
  for (int32_t& h : seq.hits) h = -7;
  for (MassUnits& m : seq.mass) m = 7;
  ASSERT_TRUE(db.Download(nullptr).ok());
  for (int32_t t = 0; t < kTables; ++t) {
    for (int32_t p = 0; p < capacity; ++p) {
      // Position p of table t sits at t * capacity + p in the host arrays.
      const size_t at = size_t(t) * capacity + p;
      const bool in = p >= begin && p <= pos;
      ASSERT_EQ(seq.hits[at], in ? hits0[at] : -7) << "table " << t << " position " << p;
      ASSERT_EQ(seq.mass[at], in ? mass0[at] : 7u) << "table " << t << " position " << p;
    }
  }
}

// The length a step's split plan is sized for (the CUDA graph key of decode steps): never
// shorter than the rows, a multiple of 256, at most 255 keys more below 4,096 and 12.5% more
// past it, so a growing row changes it every 256 keys at first and ever more rarely after.
TEST(PlannedLengthTest, StepsOf256ThenAnEighthOfThePowerOfTwo) {
  for (const auto& [len, planned] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 256}, {200, 256}, {256, 256}, {257, 512}, {4095, 4096}, {4096, 4096},
           {4097, 4608}, {32768, 32768}, {32769, 36864}, {131072, 131072}}) {
    EXPECT_EQ(PlannedLength(len), planned) << len;
  }
  int64_t changes = 0;
  for (int64_t len = 1; len <= 131072; ++len) {
    const int64_t p = PlannedLength(len);
    ASSERT_GE(p, len);
    ASSERT_EQ(p % 256, 0) << len;
    ASSERT_LE(p - len, std::max<int64_t>(255, len / 8)) << len;
    changes += len > 1 && p != PlannedLength(len - 1);
  }
  EXPECT_EQ(changes, 15 + 8 * 5) << "256-key steps to 4,096, then 8 per doubling";
}

}  // namespace
}  // namespace thetaserve::kernels::cuda
