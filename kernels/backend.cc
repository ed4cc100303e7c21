#include "kernels/backend.h"

#include "absl/strings/str_format.h"
#include "kernels/cpu/cpu_backend.h"

#if THETASERVE_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace thetaserve::kernels {

int64_t LogitRows(const ForwardBatch& batch, const SeqChunk& seq) {
  if (batch.all_logits || seq.all_logits) return seq.num_tokens;
  return seq.want_logits && seq.num_tokens > 0 ? 1 : 0;
}

int64_t NumLogitRows(const ForwardBatch& batch) {
  int64_t rows = 0;
  for (const SeqChunk& seq : batch.seqs) rows += LogitRows(batch, seq);
  return rows;
}

float* Backend::LogitsMemory(int64_t floats, std::vector<float>* fallback) {
  absl::StatusOr<float*> own = LogitsBuffer(floats);
  if (own.ok() && *own != nullptr) return *own;
  fallback->resize(floats);
  return fallback->data();
}

int64_t Backend::kv_row_bytes() const {
  return KvRowBytes(kv_dtype(), model_->config().head_dim);
}

absl::Status Backend::SetKvLayout(int64_t num_pages, int32_t block_size) {
  if (num_pages <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV pool needs pages > 0 and block size > 0 (got %d pages of %d rows)",
                        num_pages, block_size));
  }
  kv_layout_ = KvPoolLayout{block_size, static_cast<int32_t>(model_->config().head_dim), num_pages};
  return absl::OkStatus();
}

absl::Status Backend::SetHostLayout(int64_t num_pages) {
  if (kv_layout_.num_pages <= 0) return absl::FailedPreconditionError("KV pool not allocated");
  if (num_pages < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("host pool of %d pages", num_pages));
  }
  kv_layout_.num_host_pages = num_pages;
  return absl::OkStatus();
}

absl::Status Backend::CheckKvRowCopies(std::span<const KvRowCopy> copies, bool to_host) const {
  const int64_t dst_pages = to_host ? kv_layout_.num_host_pages : kv_layout_.num_pages;
  const auto row_ok = [&](int32_t r) { return r >= 0 && r < kv_layout_.block_size; };
  for (const KvRowCopy& c : copies) {
    if (c.src_page < 0 || c.src_page >= kv_layout_.num_pages || c.dst_page < 0 ||
        c.dst_page >= dst_pages || !row_ok(c.src_row) || !row_ok(c.dst_row)) {
      return absl::InternalError(absl::StrFormat(
          "KV row copy outside the pool (page %d row %d -> %spage %d row %d; %d pages, %d host "
          "pages, of %d rows)",
          c.src_page, c.src_row, to_host ? "host " : "", c.dst_page, c.dst_row,
          kv_layout_.num_pages, kv_layout_.num_host_pages, kv_layout_.block_size));
    }
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckDenseV(const ForwardBatch& batch) const {
  if (top_theta_.active()) return absl::OkStatus();
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqPageTables& pages = batch.seqs[s].pages;
    if (pages.v_tail_start != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "sequence %d of the batch keeps V rows only from position %d on (a sparse V store): "
          "attention without Top-θ needs every row",
          s, pages.v_tail_start));
    }
  }
  return absl::OkStatus();
}

bool CudaAvailable() {
#if THETASERVE_HAVE_CUDA
  return cuda::DeviceCount() > 0;
#else
  return false;
#endif
}

// The only place that asks whether CUDA is built in.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const model::Model& model, Device device,
                                                       int threads, MatMulMode matmul,
                                                       KvDtype kv_dtype) {
  if (device == Device::kAuto) device = CudaAvailable() ? Device::kCuda : Device::kCpu;
  if (device == Device::kCuda) {
    if (kv_dtype != KvDtype::kAuto && kv_dtype != KvDtype::kBf16) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--kv-cache-dtype %s: the CUDA backend stores the KV cache in bf16 only; use bf16 or "
          "auto (or --device cpu)",
          KvDtypeName(kv_dtype)));
    }
#if THETASERVE_HAVE_CUDA
    return cuda::CreateCudaBackend(model);
#else
    return absl::UnimplementedError(
        "this build has no CUDA backend (nvcc was not found at configure time); use --device cpu");
#endif
  }
  if (kv_dtype == KvDtype::kQ8_0 && model.config().head_dim % kQ8BlockElems != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv-cache-dtype q8_0 quantizes rows in blocks of %d elements, and this model's "
        "head_dim is %d; use f16, bf16, fp8 or f32",
        kQ8BlockElems, model.config().head_dim));
  }
  return std::unique_ptr<Backend>(new cpu::CpuBackend(model, threads, matmul, kv_dtype));
}

}  // namespace thetaserve::kernels
