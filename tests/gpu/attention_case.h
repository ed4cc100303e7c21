// The GPU attention tests' harness (gpu_attention_test.cc): a case of sequences over a paged
// pool, run through the CUDA attention (CudaAttention, the way AttnWay names) and through the
// CPU reference (kernels/cpu/attention.cc), whose outputs, hit marks and counters it compares
// (attention_case.cc: the case's making, both runs and the comparison).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/device_batch.h"
#include "kernels/paged_kv.h"
#include "kernels/top_theta.h"
#include "model/theta_table.h"
#include "tests/gpu/gpu_test_util.h"

namespace thetaserve::kernels::cuda::attention_test {

// How a case runs the split kernels: pass 1's way of reading K, and Top-θ's passes as the
// server picks them (kAuto: one pass for pre-softmax thresholds where no retained mass is
// recorded), as two kernels, or fused into one cluster launch.
struct AttnWay {
  KLoad k_load;
  ThetaPasses passes = ThetaPasses::kAuto;
  PrefillWay prefill = PrefillWay::kMma;
  ThetaPrefill theta_prefill = ThetaPrefill::kTiled;  // where Top-θ's prefill rows go
};
inline std::string WayName(const AttnWay& w) {
  const char* passes = w.passes == ThetaPasses::kFused   ? "_fused"
                       : w.passes == ThetaPasses::kSplit ? "_split"
                                                         : "";
  return std::string(KLoadName(w.k_load)) + passes +
         (w.prefill == PrefillWay::kMma ? "" : std::string("_") + PrefillWayName(w.prefill) +
                                                   "_prefill") +
         (w.theta_prefill == ThetaPrefill::kTiled
              ? ""
              : std::string("_") + ThetaPrefillName(w.theta_prefill) + "_theta_prefill");
}
// For gtest's messages (found by argument-dependent lookup).
inline void PrintTo(const AttnWay& w, std::ostream* os) { *os << WayName(w); }

using testing::GuardedArray;
using testing::RoundBf16;

struct SeqSpec {
  int32_t start_pos;
  int32_t num_tokens;
  int32_t v_tail_start = 0;  // > 0: older V rows live in a sparse store (every third kept)
  bool v_sum = true;         // the sequence has running V sums (VMC applies to it)
  int32_t sink = -1;         // >= 0: this position's keys score about 30 (an attention sink)
  bool host = false;         // the rows the sparse store drops are in a host store instead
};

struct Shape {
  int32_t num_layers = 2, layer = 1, num_heads = 9, num_kv_heads = 3, head_dim = 64;
  int32_t block_size = 16;
};

// Keys are noise plus, at every tenth position, a large component along a direction the
// queries share: scores are bimodal (about N(0, 0.35) and 4 ± 0.5), so a threshold between
// the modes keeps the same rows on both sides regardless of rounding. Not for every head: the
// upper mode's centre moves with each query (4 + 0.5·N(0, 1)), and where it sits low a
// post-softmax threshold can fall inside the lower mode, among many rows.
class AttentionCase {
 public:
  AttentionCase(const Shape& s, std::vector<SeqSpec> specs, uint64_t seed, AttnWay way);

  int32_t num_tokens() const { return num_tokens_; }

  // Runs both sides; fills outputs and stats.
  void Run(const TopThetaConfig& config, bool with_vsum);

  void RunAndExpectSame(const TopThetaConfig& config, bool with_vsum) {
    Run(config, with_vsum);
    ExpectSame(config);
  }

  // The last Run's GPU side against its CPU side: outputs (within kAtol, kRtol), stats, hit
  // marks and retained mass; decisions within rounding of θ may go either way.
  void ExpectSame(const TopThetaConfig& config = {});

  const AttentionStats& cpu_stats() const { return cpu_stats_; }
  // Hit marks the CPU side set, over every sequence and table.
  int64_t cpu_marks() const {
    int64_t n = 0;
    for (const Seq& q : seqs_) {
      n += std::count_if(q.hits_cpu.begin(), q.hits_cpu.end(), [](int32_t v) { return v >= 0; });
    }
    return n;
  }
  int32_t chunk() const { return chunk_; }
  // Whether the sequences record the retained mass (SeqPageTables::hit_mass) from the next Run
  // on; by default where the way names its passes (under kAuto a step that records it takes
  // two passes, so pre-softmax thresholds would not run in one).
  void set_record_mass(bool on) { record_mass_ = on; }
  bool records_mass() const { return record_mass_; }
  bool one_pass() const { return one_pass_; }
  // CudaAttention::set_kernel_limit for the next Run.
  void set_kernel_limit(int32_t n) { kernel_limit_ = n; }
  // Kernels the last Run launched (counted by the emulator; -1 on a GPU).
  int64_t kernel_launches() const { return kernel_launches_; }
  const std::vector<float>& gpu_out() const { return gpu_out_; }
  const AttentionStats& gpu_stats() const { return gpu_stats_; }
  int32_t splits() const { return splits_; }
  // Σ of the CPU side's retained mass over every sequence and row.
  double total_mass() const {
    double sum = 0;
    for (const Seq& q : seqs_) {
      for (MassUnits m : q.mass_cpu) sum += MassValue(m);
    }
    return sum;
  }

 private:
  // Pass 2 decides rows near a threshold on ExactScore, which must be pass 1's f32 score bit
  // for bit (same products, same order: per thread, staged or per quad) for the GPU to keep
  // exactly the rows the f32 scores keep. Checked directly, for every row and head of the last
  // launch: the exact scores' max over each split is pass 1's split max, bit for bit, and
  // encoding them below it gives pass 1's 16-bit scores (one pass: the maxima only).
  void ExpectExactScoresArePass1s(const CudaAttention& att, const DeviceBatch& db,
                                  const AttnShape& shape, const float* q, const uint16_t* pool);

  // The CPU reference over `chunks` (whose hit marks and retained mass it sets) into `out`.
  void RunCpu(const TopThetaConfig& config, const std::vector<SeqChunk>& chunks,
              AttentionStats* stats, std::vector<float>* out) const;

  // How near θ (relative; pre-softmax at least absolute) a key's score or probability may be
  // decided either way by rounding (FindAmbiguous), and how far CpuOutputNudged moves θ: past
  // that window, so each key within it falls on one side (and keys up to half a window beyond
  // it flip too: a row with a key there as well as one within matches neither alternative).
  static constexpr double kWindow = 1e-5;
  static constexpr double kNudge = 1.5 * kWindow;

  // The CPU reference's output with every θ of the table moved by `sign` · kNudge (relative,
  // and at least kNudge absolute pre-softmax); exactly so where θ is a bucket's value or between
  // two (as in MakeTable's tables), less surely past the last bucket, where Finalize refits the
  // slope. Marks, mass and stats go to scratch.
  std::vector<float> CpuOutputNudged(const TopThetaConfig& config, int sign) const;

  // The (head, key) decisions that rounding may flip: with a θ table, keys whose score
  // (pre-softmax) or probability (post-softmax), in float64, lies within kWindow of θ (relative).
  // The two sides sum D_full and round exp differently (the CPU by 512-key chunks, the GPU by
  // splits), so such a key can be kept on one side only. Counted per sequence and position
  // (summed over the group's heads, with their probabilities), and in all.
  struct Ambiguous {
    int64_t total = 0;
    // [seq][table * end + j - hits_begin]: those keys' probabilities, as marks are indexed
    std::vector<std::vector<float>> mass;
    std::vector<std::vector<int32_t>> count;  // same shape: how many
    // [token * num_heads + head]: the query row has a key within rounding of its keep
    // threshold (its output may follow either decision)
    std::vector<char> rows;
  };
  Ambiguous FindAmbiguous(const TopThetaConfig& config) const;

  static constexpr float kAtol = 2e-4f, kRtol = 2e-3f;  // the attention output's tolerance

  // The output the GPU's must match: the CPU's, but for a query row with a key within rounding
  // of its keep threshold, which may follow either decision: there the CPU's with every such
  // key dropped, or kept, where the GPU's matches that and not the CPU's own (counted in
  // `rows_either`). (A row with two such keys decided differently matches none: rare enough to
  // leave failing.) Every other row is held to the CPU's output.
  std::vector<float> ExpectedOutput(const TopThetaConfig& config, const Ambiguous& amb,
                                    int32_t* rows_either) const;

  float scale() const { return 1.0f / std::sqrt(float(s_.head_dim)); }  // the scores' 1/√d

  struct Seq {
    std::vector<int32_t> k, v, sparse_pages, sparse_pos, sparse_count, sparse_positions;
    int32_t sparse_stride = 1;
    std::vector<int32_t> host_pages, host_pos, host_count, host_positions;
    int32_t host_stride = 1;
    int32_t window = 0;  // positions with marks: [v_tail_start, end)
    std::vector<int32_t> hits_cpu, hits_gpu;
    std::vector<MassUnits> mass_cpu, mass_gpu;  // fixed point (kernels/paged_kv.h)
    std::vector<float> vsum_cpu, vsum_gpu;
  };
  Shape s_;
  std::vector<SeqSpec> specs_;
  std::mt19937_64 rng_;
  KLoad k_load_;
  ThetaPasses passes_;
  PrefillWay prefill_;
  ThetaPrefill theta_prefill_;
  bool record_mass_;    // sequences record the retained mass (hit_mass): two passes
  bool with_vsum_ = false;  // the last Run's: VMC reads the V sums
  bool one_pass_ = false;  // the last Run's plan
  int32_t tables_ = 0, stride_ = 0, num_tokens_ = 0, splits_ = 0, chunk_ = 0;
  int64_t num_pages_ = 0;
  KvPoolLayout layout_;
  std::vector<float> pool_, u_, q_, vsum_, cpu_out_, gpu_out_;
  int32_t kernel_limit_ = 0;
  int64_t kernel_launches_ = -1;
  std::vector<float> host_pool_;  // [num_host_pages, block_size, head_dim]
  std::vector<int32_t> tokens_;
  std::vector<Seq> seqs_;
  std::vector<SeqChunk> chunks_cpu_, chunks_gpu_;
  AttentionStats cpu_stats_, gpu_stats_;
};

model::ThetaTable MakeTable(const Shape& s, model::ThetaPlacement placement, int32_t k);

// Asks the plan for `keys` keys per split (THETASERVE_ATTN_CHUNK) while it lives; null asks for
// nothing.
struct ChunkEnv {
  explicit ChunkEnv(const char* keys) {
    if (keys) setenv("THETASERVE_ATTN_CHUNK", keys, 1);
  }
  ~ChunkEnv() { unsetenv("THETASERVE_ATTN_CHUNK"); }
};

}  // namespace thetaserve::kernels::cuda::attention_test
