// The CPU backend: the full LLaMA-family forward pass, multithreaded, AVX2 inner loops.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_dtype.h"

namespace thetaserve::kernels::cpu {

class CpuBackend : public Backend {
 public:
  // `kv_dtype`: the pages' element type (auto: f16, which on SmolLM2 gives f32's perplexity
  // with half the bytes: docs/results.md). q8_0 needs a head_dim that is a multiple of 32
  // (CreateBackend checks).
  CpuBackend(const model::Model& model, int threads,
             MatMulMode matmul = MatMulMode::kQuantized, KvDtype kv_dtype = KvDtype::kAuto);
  std::string name() const override { return "cpu"; }
  MatMulMode matmul_mode() const { return matmul_; }
  KvDtype kv_dtype() const override { return kv_dtype_; }
  std::string matmul_activations() const override {
    return matmul_ == MatMulMode::kExact ? "f32" : "int8";
  }
  absl::Status AllocateKvPool(int64_t num_pages, int32_t block_size) override;
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  absl::Status AllocateHostPool(int64_t num_pages) override;
  absl::Status CopyKvRows(std::span<const KvRowCopy> copies) override;
  absl::Status OffloadKvRows(std::span<const KvRowCopy> copies) override;
  absl::Status SumVRows(const SeqPageTables& pages, int64_t length) override;
  std::optional<int64_t> FreeMemoryBytes() const override;

 private:
  // Per-step activations of the step's T tokens, grown to the largest batch seen: x, h
  // [T, hidden]; q, attn [T, q_dim]; k, v, vsum [T, kv_dim]; gate, up, act [T, intermediate];
  // last [logit rows, hidden] (the rows of x whose logits are wanted, gathered).
  struct Scratch {
    std::vector<float> x, h, q, k, v, attn, gate, up, act, last, vsum;
    void Resize(int64_t T, const model::ModelConfig& c);
  };

  // Pool storage as elements of type T (kv_dtype_'s).
  template <typename T>
  T* Pool() { return reinterpret_cast<T*>(kv_pool_.data()); }
  template <typename T>
  T* HostPool() { return reinterpret_cast<T*>(host_pool_.get()); }
  size_t RowBytes() const { return size_t(KvRowBytes(kv_dtype_, kv_layout_.head_dim)); }
  size_t RowByteOffset(int32_t page, int32_t row) const {
    return (size_t(page) * kv_layout_.block_size + row) * RowBytes();
  }
  size_t PageBytes() const { return size_t(kv_layout_.block_size) * RowBytes(); }

  ThreadPool pool_;
  MatMulMode matmul_;
  KvDtype kv_dtype_;
  Rope rope_;
  // [num_pages, block_size, RowBytes()] bytes: rows of kv_dtype_, as bytes (which may hold
  // objects of any type, C++20 [intro.object]).
  std::vector<std::byte> kv_pool_;
  // [num_host_pages, block_size, RowBytes()], left uninitialized: the OS commits its memory as
  // rows are offloaded there, not at allocation (which fails only past what the OS will
  // promise, RAM plus swap under Linux's default overcommit).
  std::unique_ptr<std::byte[]> host_pool_;
  Scratch scratch_;
};

}  // namespace thetaserve::kernels::cpu
