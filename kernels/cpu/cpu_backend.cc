#include "kernels/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "absl/strings/str_format.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/vec.h"

namespace thetaserve::kernels::cpu {

CpuBackend::CpuBackend(const model::Model& model, int threads, MatMulMode matmul,
                       KvDtype kv_dtype)
    : Backend(model),
      pool_(threads),
      matmul_(matmul),
      kv_dtype_(kv_dtype == KvDtype::kAuto ? KvDtype::kF16 : kv_dtype),
      rope_(model.config()) {}

void CpuBackend::Scratch::Resize(int64_t T, const model::ModelConfig& c) {
  auto grow = [](std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  };
  grow(x, T * c.hidden_size);
  grow(h, T * c.hidden_size);
  grow(q, T * c.q_dim());
  grow(k, T * c.kv_dim());
  grow(v, T * c.kv_dim());
  grow(attn, T * c.q_dim());
  grow(gate, T * c.intermediate_size);
  grow(up, T * c.intermediate_size);
  grow(act, T * c.intermediate_size);
  grow(last, T * c.hidden_size);
  grow(vsum, T * c.kv_dim());
}

absl::Status CpuBackend::AllocateKvPool(int64_t num_pages, int32_t block_size) {
  if (absl::Status st = SetKvLayout(num_pages, block_size); !st.ok()) return st;
  kv_pool_.assign(num_pages * PageBytes(), std::byte{0});
  host_pool_.reset();
  return absl::OkStatus();
}

absl::Status CpuBackend::AllocateHostPool(int64_t num_pages) {
  host_pool_.reset();
  if (absl::Status st = SetHostLayout(num_pages); !st.ok()) return st;
  if (num_pages == 0) return absl::OkStatus();
  const size_t bytes = size_t(num_pages) * PageBytes();
  host_pool_.reset(new (std::nothrow) std::byte[bytes]);
  if (!host_pool_) {
    kv_layout_.num_host_pages = 0;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot reserve %d bytes of host memory for the offload pool; use a smaller "
        "--offload-memory", bytes));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::OffloadKvRows(std::span<const KvRowCopy> copies) {
  if (absl::Status st = CheckKvRowCopies(copies, /*to_host=*/true); !st.ok()) return st;
  for (const KvRowCopy& c : copies) {
    std::memcpy(host_pool_.get() + RowByteOffset(c.dst_page, c.dst_row),
                kv_pool_.data() + RowByteOffset(c.src_page, c.src_row), RowBytes());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyKvRows(std::span<const KvRowCopy> copies) {
  if (absl::Status st = CheckKvRowCopies(copies); !st.ok()) return st;
  for (const KvRowCopy& c : copies) {
    // In order, and memmove: compaction may copy a row onto itself or an earlier slot.
    std::memmove(kv_pool_.data() + RowByteOffset(c.dst_page, c.dst_row),
                 kv_pool_.data() + RowByteOffset(c.src_page, c.src_row), RowBytes());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::SumVRows(const SeqPageTables& pages, int64_t length) {
  if (kv_pool_.empty()) return absl::FailedPreconditionError("KV pool not allocated");
  if (!pages.v_sum) return absl::OkStatus();
  if (pages.v_tail_start != 0) {
    return absl::FailedPreconditionError("SumVRows needs the dense V tail from position 0");
  }
  const auto& c = model_->config();
  const int64_t d = kv_layout_.head_dim;
  return WithKvElement(kv_dtype_, [&]<typename T>(T) -> absl::Status {
    const KvPoolLayout stored = StoredLayout<T>(kv_layout_);
    std::vector<float> v(d);
    for (int64_t t = 0; t < int64_t(c.num_layers) * c.num_kv_heads; ++t) {
      float* sum = pages.v_sum + t * d;
      std::fill(sum, sum + d, 0.0f);
      // Position order, one add per element: the additions WriteKv made.
      for (int64_t pos = 0; pos < length; ++pos) {
        const int32_t page = pages.VPage(t, pos, kv_layout_.block_size);
        if (page < 0 || page >= kv_layout_.num_pages) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "V page %d of table %d at position %d is outside the pool", page, t, pos));
        }
        WidenRow(Pool<T>() + stored.RowOffset(page, pos % kv_layout_.block_size), d, v.data());
        for (int64_t e = 0; e < d; ++e) sum[e] += v[e];
      }
    }
    return absl::OkStatus();
  });
}

absl::Status CpuBackend::Forward(const ForwardBatch& batch, float* logits) {
  const model::ModelConfig& c = model_->config();
  const model::ModelWeights& w = model_->weights();
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return absl::OkStatus();
  if (kv_pool_.empty()) return absl::FailedPreconditionError("KV pool not allocated");
  if (batch.argmax) {
    return absl::InvalidArgumentError("the CPU backend returns logits, not their argmax");
  }
  if (absl::Status st = CheckDenseV(batch); !st.ok()) return st;
  for (int32_t tok : batch.tokens) {
    if (tok < 0 || tok >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d outside the vocabulary [0, %d)", tok, c.vocab_size));
    }
  }
  scratch_.Resize(T, c);
  float* x = scratch_.x.data();
  float* h = scratch_.h.data();
  float* q = scratch_.q.data();
  float* k = scratch_.k.data();
  float* v = scratch_.v.data();
  float* attn = scratch_.attn.data();
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.intermediate_size;

  AttentionShape shape{c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
                       1.0f / std::sqrt(static_cast<float>(c.head_dim))};

  Embed(pool_, w.tok_embeddings, batch.tokens.data(), T, x);

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const model::LayerWeights& lw = w.layers[l];
    RmsNorm(x, static_cast<const float*>(lw.attn_norm.data), T, hidden, c.rms_norm_eps, h);
    const MatMulOut qkv[] = {{&lw.wq, static_cast<const float*>(lw.bq.data), q},
                             {&lw.wk, static_cast<const float*>(lw.bk.data), k},
                             {&lw.wv, static_cast<const float*>(lw.bv.data), v}};
    MatMuls(pool_, h, T, qkv, matmul_);
    for (const SeqChunk& seq : batch.seqs) {
      for (int32_t i = 0; i < seq.num_tokens; ++i) {
        const int64_t row = seq.token_offset + i;
        rope_.Apply(q + row * c.q_dim(), c.num_heads, seq.start_pos + i);
        rope_.Apply(k + row * c.kv_dim(), c.num_kv_heads, seq.start_pos + i);
      }
    }
    float* vsum = top_theta_.active() ? scratch_.vsum.data() : nullptr;
    WithKvElement(kv_dtype_, [&]<typename T>(T) {
      const KvPoolLayout stored = StoredLayout<T>(kv_layout_);
      WriteKv(batch, shape, l, k, v, stored, Pool<T>(), vsum);
      PagedAttention(pool_, batch, shape, top_theta_,
                     LayerAttention<T>{.layer = l, .q = q, .layout = stored, .kv_pool = Pool<T>(),
                                       .host_pool = HostPool<T>(), .vsum_rows = vsum, .o = attn});
    });
    MatMul(pool_, attn, T, lw.wo, nullptr, x, /*accumulate=*/true, matmul_);

    RmsNorm(x, static_cast<const float*>(lw.ffn_norm.data), T, hidden, c.rms_norm_eps, h);
    const MatMulOut gate_up[] = {{&lw.w_gate, nullptr, scratch_.gate.data()},
                                 {&lw.w_up, nullptr, scratch_.up.data()}};
    MatMuls(pool_, h, T, gate_up, matmul_);
    pool_.ParallelFor(T, 8, [&](int64_t b, int64_t e) {
      SiluMul(scratch_.gate.data() + b * inter, scratch_.up.data() + b * inter, (e - b) * inter,
              scratch_.act.data() + b * inter);
    });
    MatMul(pool_, scratch_.act.data(), T, lw.w_down, nullptr, x, /*accumulate=*/true, matmul_);
  }

  // Final norm and LM head only for the rows whose logits are wanted.
  float* last = scratch_.last.data();
  int64_t rows = 0;
  for (const SeqChunk& seq : batch.seqs) {
    if (batch.all_logits || seq.all_logits) {
      std::memcpy(last + rows * hidden, x + int64_t(seq.token_offset) * hidden,
                  seq.num_tokens * hidden * sizeof(float));
      rows += seq.num_tokens;
    } else if (seq.want_logits && seq.num_tokens > 0) {
      std::memcpy(last + rows * hidden,
                  x + int64_t(seq.token_offset + seq.num_tokens - 1) * hidden,
                  hidden * sizeof(float));
      rows += 1;
    }
  }
  if (rows == 0) return absl::OkStatus();
  RmsNorm(last, static_cast<const float*>(w.output_norm.data), rows, hidden, c.rms_norm_eps, h);
  MatMul(pool_, h, rows, w.output, nullptr, logits, /*accumulate=*/false, matmul_);
  return absl::OkStatus();
}

// MemAvailable of /proc/meminfo (what the kernel can hand out without swapping).
std::optional<int64_t> CpuBackend::FreeMemoryBytes() const {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace thetaserve::kernels::cpu
