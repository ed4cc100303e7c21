// The CPU backend: the full LLaMA-family forward pass, multithreaded, AVX2 inner loops.
#pragma once

#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace thetaserve::kernels::cpu {

class CpuBackend : public Backend {
 public:
  CpuBackend(const model::Model& model, int threads,
             MatMulMode matmul = MatMulMode::kQuantized);
  std::string name() const override { return "cpu"; }
  MatMulMode matmul_mode() const { return matmul_; }
  absl::Status AllocateKvPool(int64_t num_pages, int32_t block_size) override;
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  absl::Status AllocateHostPool(int64_t num_pages) override;
  absl::Status CopyKvRows(std::span<const KvRowCopy> copies) override;
  absl::Status OffloadKvRows(std::span<const KvRowCopy> copies) override;
  absl::Status SumVRows(const SeqPageTables& pages, int64_t length) override;
  std::optional<int64_t> FreeMemoryBytes() const override;

  ThreadPool& pool() { return pool_; }
  const float* kv_data() const { return kv_pool_.data(); }

 private:
  // Per-step activations, grown to the largest batch seen.
  struct Scratch {
    std::vector<float> x, h, q, k, v, attn, gate, up, act, last, vsum;
    void Resize(int64_t T, const model::ModelConfig& c);
  };

  ThreadPool pool_;
  MatMulMode matmul_;
  Rope rope_;
  std::vector<float> kv_pool_;  // [num_pages, block_size, head_dim]
  // [num_host_pages, block_size, head_dim], left uninitialized: the OS commits its memory as
  // rows are offloaded there, not at allocation (which fails only past what the OS will
  // promise, RAM plus swap under Linux's default overcommit).
  std::unique_ptr<float[]> host_pool_;
  Scratch scratch_;
};

}  // namespace thetaserve::kernels::cpu
