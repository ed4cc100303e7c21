#include "kernels/cuda/device_batch.h"

#include <algorithm>
#include <cstring>

namespace thetaserve::kernels::cuda {
namespace {

size_t Align(size_t n) { return (n + 15) / 16 * 16; }

}  // namespace

absl::Status DeviceBatch::Upload(const ForwardBatch& batch, int32_t num_tables,
                                 int32_t head_dim, cudaStream_t stream, bool with_hits) {
  const size_t T = batch.tokens.size();
  const size_t S = batch.seqs.size();
  host_rows_.assign(T, DevRow{});
  host_seqs_.assign(S, DevSeq{});
  back_.clear();
  max_len_ = 0;
  any_vsum_ = false;

  // Pass 1: offsets. Pass 2: the same walk, copying into the staging buffer.
  struct Piece {
    const void* src;
    size_t src_stride, width, rows;  // bytes
    size_t offset;
  };
  std::vector<Piece> pieces;
  size_t used = 0;
  auto add = [&](const void* src, size_t src_stride, size_t width, size_t rows) {
    pieces.push_back({src, src_stride, width, rows, used});
    used += Align(width * rows);
    return pieces.back().offset;
  };
  const size_t tokens_off = add(batch.tokens.data(), 0, T * sizeof(int32_t), 1);
  const size_t rows_off = add(nullptr, 0, T * sizeof(DevRow), 1);
  const size_t seqs_off = add(nullptr, 0, S * sizeof(DevSeq), 1);
  struct SeqOffsets {
    size_t k, v, sp, spos, scount, vsum, hits, hits_width, mass;
  };
  std::vector<SeqOffsets> so(S);
  for (size_t s = 0; s < S; ++s) {
    const SeqChunk& c = batch.seqs[s];
    const SeqPageTables& p = c.pages;
    const int64_t end = int64_t(c.start_pos) + c.num_tokens;
    max_len_ = std::max(max_len_, end);
    for (int32_t i = 0; i < c.num_tokens; ++i) {
      host_rows_[c.token_offset + i] = DevRow{static_cast<int32_t>(s), c.start_pos + i};
    }
    const size_t table = size_t(num_tables) * p.stride * sizeof(int32_t);
    so[s].k = add(p.k_pages, 0, table, 1);
    so[s].v = add(p.v_pages, 0, table, 1);
    so[s].sp = so[s].spos = so[s].scount = so[s].vsum = so[s].hits = so[s].mass = 0;
    if (p.v_sparse_count) {
      so[s].sp = add(p.v_sparse_pages, 0, size_t(num_tables) * p.sparse_stride * sizeof(int32_t), 1);
      so[s].spos = add(p.v_sparse_pos, 0, size_t(num_tables) * p.sparse_pos_stride * sizeof(int32_t), 1);
      so[s].scount = add(p.v_sparse_count, 0, size_t(num_tables) * sizeof(int32_t), 1);
    }
    if (p.v_sum) {
      so[s].vsum = add(p.v_sum, 0, size_t(num_tables) * head_dim * sizeof(float), 1);
      back_.push_back({p.v_sum, 0, so[s].vsum, size_t(num_tables) * head_dim * sizeof(float), 1});
      any_vsum_ = true;
    }
    if (p.hits && with_hits) {
      const size_t width = size_t(std::min<int64_t>(p.hits_stride, end));
      so[s].hits_width = width;
      so[s].hits = add(p.hits, size_t(p.hits_stride) * sizeof(int32_t), width * sizeof(int32_t),
                       num_tables);
      back_.push_back({p.hits, size_t(p.hits_stride) * sizeof(int32_t), so[s].hits,
                       width * sizeof(int32_t), size_t(num_tables)});
      if (p.hit_mass) {  // same shape as the hit marks
        so[s].mass = add(p.hit_mass, size_t(p.hits_stride) * sizeof(float), width * sizeof(float),
                         num_tables);
        back_.push_back({p.hit_mass, size_t(p.hits_stride) * sizeof(float), so[s].mass,
                         width * sizeof(float), size_t(num_tables)});
      }
    }
  }
  used_ = used;
  if (absl::Status st = staging_.Reserve(used); !st.ok()) return st;
  if (absl::Status st = device_.Reserve(used); !st.ok()) return st;
  uint8_t* dev = device_.as<uint8_t>();
  uint8_t* host = staging_.data();

  for (size_t s = 0; s < S; ++s) {
    const SeqChunk& c = batch.seqs[s];
    const SeqPageTables& p = c.pages;
    DevSeq& d = host_seqs_[s];
    d.token_offset = c.token_offset;
    d.num_tokens = c.num_tokens;
    d.start_pos = c.start_pos;
    d.pages = p;
    d.pages.k_pages = reinterpret_cast<const int32_t*>(dev + so[s].k);
    d.pages.v_pages = reinterpret_cast<const int32_t*>(dev + so[s].v);
    if (p.v_sparse_count) {
      d.pages.v_sparse_pages = reinterpret_cast<const int32_t*>(dev + so[s].sp);
      d.pages.v_sparse_pos = reinterpret_cast<const int32_t*>(dev + so[s].spos);
      d.pages.v_sparse_count = reinterpret_cast<const int32_t*>(dev + so[s].scount);
    }
    if (p.v_sum) d.pages.v_sum = reinterpret_cast<float*>(dev + so[s].vsum);
    d.pages.hit_mass = nullptr;
    if (p.hits && with_hits) {
      d.pages.hits = reinterpret_cast<int32_t*>(dev + so[s].hits);
      d.pages.hits_stride = static_cast<int32_t>(so[s].hits_width);
      if (p.hit_mass) d.pages.hit_mass = reinterpret_cast<float*>(dev + so[s].mass);
    } else {
      d.pages.hits = nullptr;
      d.pages.hits_stride = 0;
    }
  }
  for (const Piece& pc : pieces) {
    if (!pc.src) continue;
    if (pc.src_stride == 0) {
      std::memcpy(host + pc.offset, pc.src, pc.width * pc.rows);
    } else {
      for (size_t r = 0; r < pc.rows; ++r) {
        std::memcpy(host + pc.offset + r * pc.width,
                    static_cast<const uint8_t*>(pc.src) + r * pc.src_stride, pc.width);
      }
    }
  }
  std::memcpy(host + rows_off, host_rows_.data(), T * sizeof(DevRow));
  std::memcpy(host + seqs_off, host_seqs_.data(), S * sizeof(DevSeq));
  TS_CUDA_RETURN(cudaMemcpyAsync(dev, host, used, cudaMemcpyHostToDevice, stream));
  tokens_ = reinterpret_cast<const int32_t*>(dev + tokens_off);
  rows_ = reinterpret_cast<const DevRow*>(dev + rows_off);
  seqs_ = reinterpret_cast<const DevSeq*>(dev + seqs_off);
  return absl::OkStatus();
}

absl::Status DeviceBatch::Download(cudaStream_t stream) {
  uint8_t* dev = device_.as<uint8_t>();
  uint8_t* host = staging_.data();
  for (const Back& b : back_) {
    TS_CUDA_RETURN(cudaMemcpyAsync(host + b.offset, dev + b.offset, b.width * b.rows,
                                   cudaMemcpyDeviceToHost, stream));
  }
  TS_CUDA_RETURN(cudaStreamSynchronize(stream));
  for (const Back& b : back_) {
    if (b.host_stride == 0) {
      std::memcpy(b.host, host + b.offset, b.width * b.rows);
    } else {
      for (size_t r = 0; r < b.rows; ++r) {
        std::memcpy(static_cast<uint8_t*>(b.host) + r * b.host_stride, host + b.offset + r * b.width,
                    b.width);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace thetaserve::kernels::cuda
