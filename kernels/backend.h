// The Backend interface: one forward pass over a batch that mixes prefill chunks and decode
// tokens of several sequences, reading and writing K/V through paged views.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/kv_dtype.h"
#include "kernels/matmul_mode.h"
#include "kernels/paged_kv.h"
#include "kernels/top_theta.h"
#include "model/model.h"

namespace thetaserve::kernels {

// One sequence's share of a step: `num_tokens` new tokens at positions
// [start_pos, start_pos + num_tokens). Their K/V rows are written into the pages named by
// `pages` (which must already cover those positions) before attention reads them.
struct SeqChunk {
  int32_t token_offset = 0;  // first row of this sequence in ForwardBatch::tokens
  int32_t num_tokens = 0;
  int32_t start_pos = 0;     // tokens already in the cache
  bool want_logits = true;   // logits of the last new token
  bool all_logits = false;   // logits of every new token (prompt log-probabilities)
  SeqPageTables pages;
  TableVersion tables;       // lets a device backend send only what changed in `pages`
};

struct ForwardBatch {
  std::span<const int32_t> tokens;  // [num_tokens], all sequences' new tokens back to back
  std::span<const SeqChunk> seqs;
  bool all_logits = false;  // logits for every token (evaluation) instead of the last ones
  AttentionStats* stats = nullptr;  // when set, attention adds its counters here
  // When set (only for a backend whose ReturnsArgmax()), Forward writes each logits row's
  // greedy pick here instead of the row: NumLogitRows(batch) token ids, each the first index
  // of the row's largest logit, never a NaN's, 0 when none is above -inf (the sampler's
  // ArgMax), and leaves `logits` unwritten (it may be null). What a step whose rows all
  // sample greedily needs: on a GPU the rows (SmolLM2's: 196 KB each) stay on the device.
  int32_t* argmax = nullptr;
};

// Logit rows Forward writes for one sequence of the batch (in sequence order), and for all.
int64_t LogitRows(const ForwardBatch& batch, const SeqChunk& seq);
int64_t NumLogitRows(const ForwardBatch& batch);

// Runs the model on one device. Set up on the thread that creates it (weights, pools,
// SetTopTheta), then driven by one thread at a time (the engine's): not reentrant (the CPU
// backend's thread pool takes one caller).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  const model::Model& model() const { return *model_; }

  // (Re)allocates KV storage for `num_pages` pages of `block_size` rows (and frees the host
  // pool).
  virtual absl::Status AllocateKvPool(int64_t num_pages, int32_t block_size) = 0;
  // (Re)allocates the host pool: `num_pages` pages of the KV pool's shape in host memory that
  // attention reads directly (mapped pinned memory on a GPU), for the V rows the offload
  // policy moves out of the KV pool. After AllocateKvPool.
  virtual absl::Status AllocateHostPool(int64_t num_pages) = 0;
  const KvPoolLayout& kv_layout() const { return kv_layout_; }
  // The pool's element type (f32, f16, bf16, fp8 or q8_0 on the CPU; bf16 on the GPU), never
  // kAuto.
  virtual KvDtype kv_dtype() const = 0;
  // What the weight matmuls multiply: "int8" (the CPU's MatMulMode::kQuantized: Q8_0, Q4_0
  // and Q4_1 weights take int8 activations, other weights f32 ones), "f32" (the CPU's kExact)
  // or "bf16" (the GPU's). For logs, ModelInfo and build_info.
  virtual std::string matmul_activations() const = 0;
  // Bytes of one stored K or V row (head_dim elements, and q8_0's scales): a page is
  // block_size of them, and the engine sizes the pool from --kv-cache-memory with it.
  int64_t kv_row_bytes() const;
  // Memory the KV pool could still take now: free device memory (CUDA), available RAM
  // (CPU, MemAvailable); nullopt when unknown. `--kv-cache-memory 90%` sizes the pool with it.
  virtual std::optional<int64_t> FreeMemoryBytes() const = 0;
  // The most rows (pages × block_size) a pool may hold, KV or host; nullopt when only memory
  // limits it. A share-sized --kv-cache-memory stops there.
  virtual std::optional<int64_t> MaxPoolRows() const { return std::nullopt; }

  // Runs the model. `logits` receives NumLogitRows(batch) rows of vocab_size floats, in
  // sequence order (and token order within a sequence when all_logits); or, with
  // batch.argmax, their greedy picks go there instead (InvalidArgument where the backend does
  // not ReturnsArgmax()).
  virtual absl::Status Forward(const ForwardBatch& batch, float* logits) = 0;
  // Whether Forward takes batch.argmax: where the logits are computed away from the host
  // (CUDA), picking there saves their copy back; on the CPU the sampler's pick is as cheap.
  virtual bool ReturnsArgmax() const { return false; }
  // Host memory for Forward's logits that this backend fills fastest, at least `floats` long,
  // valid (and its contents) until the next call; null where the caller's own memory is as
  // good. The CUDA backend hands out page-locked memory: the copy back is then one DMA at the
  // bus's speed, where into pageable memory the driver copies through staging buffers (at
  // batch 64, SmolLM2's 49,152 logits a row are 12.6 MB a step).
  virtual absl::StatusOr<float*> LogitsBuffer(int64_t floats) {
    (void)floats;
    return nullptr;
  }
  // Where Forward should write `floats` logits: LogitsBuffer's memory where the backend has it
  // and can grow it, else `fallback`, resized (page-locked memory is scarcer than memory, and
  // without it the copy back is only slower).
  float* LogitsMemory(int64_t floats, std::vector<float>* fallback);

  // Copies rows inside the KV pool, in the given order (later copies may overwrite the
  // sources of earlier ones), before the next Forward.
  virtual absl::Status CopyKvRows(std::span<const KvRowCopy> copies) = 0;
  // Copies rows from the KV pool into the host pool (dst pages are host pages), before the
  // CopyKvRows of the same compaction (whose in-place moves may overwrite these sources) and
  // before the next Forward.
  virtual absl::Status OffloadKvRows(std::span<const KvRowCopy> copies) = 0;

  // Sets pages.v_sum (VMC's running V sums, [tables, head_dim]) to the sum of each table's V
  // rows [0, length) in position order, read from the pool: what Forward accumulated while it
  // wrote them, for a sequence that adopted those rows from the prefix cache instead. The
  // rows must lie in the dense V tail (v_tail_start 0). Bit-identical to the running sums on
  // the CPU (f32 rows, the same additions); from the stored bf16 rows on the GPU.
  virtual absl::Status SumVRows(const SeqPageTables& pages, int64_t length) = 0;

  // Top-θ settings for every following Forward (the table must outlive its use).
  void SetTopTheta(const TopThetaConfig& config) { top_theta_ = config; }
  const TopThetaConfig& top_theta() const { return top_theta_; }

 protected:
  explicit Backend(const model::Model& model) : model_(&model) {}
  // What every AllocateKvPool starts with: checks the sizes and sets kv_layout_.
  absl::Status SetKvLayout(int64_t num_pages, int32_t block_size);
  // What every CopyKvRows (OffloadKvRows: to_host) starts with: each copy's pages and rows lie
  // inside the pool (the destination inside the host pool).
  absl::Status CheckKvRowCopies(std::span<const KvRowCopy> copies, bool to_host = false) const;
  // What every AllocateHostPool starts with: a KV pool exists, num_pages >= 0; sets the layout.
  absl::Status SetHostLayout(int64_t num_pages);
  // What every Forward checks: attention without Top-θ reads every V row of a sequence, so
  // none may keep V only from a later position (a sparse V store, whose dropped rows exist
  // nowhere). FailedPrecondition names the sequence.
  absl::Status CheckDenseV(const ForwardBatch& batch) const;
  const model::Model* model_;
  KvPoolLayout kv_layout_;
  TopThetaConfig top_theta_;
};

enum class Device { kCpu, kCuda, kAuto };

// The one place that knows which backends are built in. `threads` <= 0 means all cores.
// `matmul` selects the CPU backend's arithmetic for quantized weights (matmul_mode.h); the
// CUDA backend ignores it. `kv_dtype`: the KV pages' element type; the CUDA backend stores
// bf16 only (InvalidArgument for f32 or f16).
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(
    const model::Model& model, Device device, int threads,
    MatMulMode matmul = MatMulMode::kQuantized, KvDtype kv_dtype = KvDtype::kAuto);
bool CudaAvailable();

}  // namespace thetaserve::kernels
