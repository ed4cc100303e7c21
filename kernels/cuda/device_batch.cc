#include "kernels/cuda/device_batch.h"

#include <algorithm>
#include <cstring>

namespace thetaserve::kernels::cuda {
namespace {

size_t Align(size_t n) { return (n + 15) / 16 * 16; }

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

}  // namespace

size_t DeviceBatch::Add(const void* src, size_t src_stride, size_t width, size_t rows) {
  pieces_.push_back({src, src_stride, width, rows, used_});
  used_ += Align(width * rows);
  return pieces_.back().offset;
}

DeviceBuffer& DeviceBatch::Buffer(Retained& r, Array array) {
  switch (array) {
    case Array::kK: return r.k;
    case Array::kV: return r.v;
    case Array::kSparsePages: return r.sparse.pages;
    case Array::kSparsePos: return r.sparse.pos;
    case Array::kHostPages: return r.host.pages;
    case Array::kHostPos: return r.host.pos;
  }
  return r.k;
}

// The tables of one sequence with an identity: whole arrays where the retained copy is new or
// its epoch changed, otherwise the columns and rows added since it was last sent.
void DeviceBatch::PlanTables(const SeqChunk& c, int32_t num_tables, int32_t block_size,
                             SeqOffsets* so) {
  const SeqPageTables& p = c.pages;
  const TableVersion& v = c.tables;
  so->retained = v.id;
  auto [it, fresh] = mirrors_.try_emplace(v.id);
  Retained& r = it->second;
  r.step = step_;
  const int32_t tables = num_tables;
  // Columns [from, to) of every table row (a row of `stride` entries).
  auto columns = [&](Array array, const int32_t* src, int32_t stride, int32_t from, int32_t to) {
    if (to <= from) return;
    const size_t width = size_t(to - from) * sizeof(int32_t);
    const size_t off = Add(src + from, size_t(stride) * sizeof(int32_t), width, tables);
    copies_.push_back({v.id, array, size_t(from), stride, off, to - from, tables});
  };
  // A new array of [tables, stride] with the first `used` columns of every row set (the
  // others are never read).
  auto renew = [&](Array array, const int32_t* src, int32_t stride, int32_t used) {
    allocs_.push_back({v.id, array, size_t(tables) * stride});
    columns(array, src, stride, 0, used);
  };

  // K: only whole columns are added between epochs.
  if (fresh || r.version.k_epoch != v.k_epoch || v.k_blocks < r.version.k_blocks) {
    renew(Array::kK, p.k_pages, p.stride, v.k_blocks);
  } else {
    columns(Array::kK, p.k_pages, p.stride, r.version.k_blocks, v.k_blocks);
  }
  // The V tail: its columns start at v_tail_start, which moves only with a new epoch (under
  // the sparse policy that is every block; the tail is short then).
  const int32_t v_blocks = v.k_blocks - p.v_tail_start / block_size;
  if (fresh || r.version.v_epoch != v.v_epoch || v_blocks < r.v_blocks) {
    renew(Array::kV, p.v_pages, p.stride, v_blocks);
  } else {
    columns(Array::kV, p.v_pages, p.stride, r.v_blocks, v_blocks);
  }
  r.v_blocks = v_blocks;

  // The sparse and host stores: rows appended per table (positions, and their pages as they
  // fill).
  auto store = [&](const StoreView& view, uint64_t epoch, StoreMirror& m, Array pages_array,
                   Array pos_array) {
    const bool has = view.count != nullptr;
    if (has) {
      bool all = fresh || !m.has || m.epoch != epoch;
      for (int32_t t = 0; !all && t < tables; ++t) all = view.count[t] < m.rows[t];
      if (all) {
        // Whole rows: their used length differs per table.
        const int32_t max_rows = *std::max_element(view.count, view.count + tables);
        renew(pages_array, view.pages, view.page_stride, CeilDiv(max_rows, block_size));
        renew(pos_array, view.pos, view.pos_stride, max_rows);
      } else {
        for (int32_t t = 0; t < tables; ++t) {
          const int32_t from = m.rows[t], to = view.count[t];
          if (to == from) continue;
          const int32_t* pos = view.pos + size_t(t) * view.pos_stride;
          size_t off = Add(pos + from, 0, size_t(to - from) * sizeof(int32_t), 1);
          copies_.push_back({v.id, pos_array, size_t(t) * view.pos_stride + from, 0, off,
                             to - from, 1});
          const int32_t pages_from = CeilDiv(from, block_size), pages_to = CeilDiv(to, block_size);
          if (pages_to > pages_from) {
            const int32_t* pages = view.pages + size_t(t) * view.page_stride;
            off = Add(pages + pages_from, 0, size_t(pages_to - pages_from) * sizeof(int32_t), 1);
            copies_.push_back({v.id, pages_array, size_t(t) * view.page_stride + pages_from, 0,
                               off, pages_to - pages_from, 1});
          }
        }
      }
      m.rows.assign(view.count, view.count + tables);
    }
    m.has = has;
    m.epoch = epoch;
  };
  store({p.v_sparse_pages, p.v_sparse_pos, p.v_sparse_count, p.sparse_stride, p.sparse_pos_stride},
        v.sparse_epoch, r.sparse, Array::kSparsePages, Array::kSparsePos);
  store({p.v_host_pages, p.v_host_pos, p.v_host_count, p.host_stride, p.host_pos_stride},
        v.host_epoch, r.host, Array::kHostPages, Array::kHostPos);
  r.version = v;
}

size_t DeviceBatch::Plan(const ForwardBatch& batch, int32_t num_tables, const KvPoolLayout& layout,
                         bool with_hits) {
  const size_t T = batch.tokens.size();
  const size_t S = batch.seqs.size();
  const int32_t head_dim = layout.head_dim;
  host_rows_.assign(T, DevRow{});
  host_seqs_.assign(S, DevSeq{});
  pieces_.clear();
  back_.clear();
  copies_.clear();
  allocs_.clear();
  used_ = 0;
  max_len_ = 0;
  any_vsum_ = false;
  ++step_;
  auto add_back = [&](void* host, size_t host_stride, size_t width, size_t rows) {
    const size_t offset = Add(host, host_stride, width, rows);
    back_.push_back({host, host_stride, offset, width, rows});
    return offset;
  };
  tokens_off_ = Add(batch.tokens.data(), 0, T * sizeof(int32_t), 1);
  rows_off_ = Add(nullptr, 0, T * sizeof(DevRow), 1);
  seqs_off_ = Add(nullptr, 0, S * sizeof(DevSeq), 1);
  // Device pointers are set by Upload, once the buffers exist.
  seq_offsets_.assign(S, SeqOffsets{});
  for (size_t s = 0; s < S; ++s) {
    const SeqChunk& c = batch.seqs[s];
    const SeqPageTables& p = c.pages;
    SeqOffsets& so = seq_offsets_[s];
    const int64_t end = int64_t(c.start_pos) + c.num_tokens;
    max_len_ = std::max(max_len_, end);
    for (int32_t i = 0; i < c.num_tokens; ++i) {
      host_rows_[c.token_offset + i] = DevRow{static_cast<int32_t>(s), c.start_pos + i};
    }
    DevSeq& d = host_seqs_[s];
    d.token_offset = c.token_offset;
    d.num_tokens = c.num_tokens;
    d.start_pos = c.start_pos;
    d.pages = p;
    if (c.tables.id != 0) {
      PlanTables(c, num_tables, layout.block_size, &so);
    } else {
      const size_t table = size_t(num_tables) * p.stride * sizeof(int32_t);
      so.k = Add(p.k_pages, 0, table, 1);
      so.v = Add(p.v_pages, 0, table, 1);
      if (p.v_sparse_count) {
        so.sp = Add(p.v_sparse_pages, 0, size_t(num_tables) * p.sparse_stride * sizeof(int32_t), 1);
        so.spos = Add(p.v_sparse_pos, 0, size_t(num_tables) * p.sparse_pos_stride * sizeof(int32_t), 1);
      }
      if (p.v_host_count) {
        so.hp = Add(p.v_host_pages, 0, size_t(num_tables) * p.host_stride * sizeof(int32_t), 1);
        so.hpos = Add(p.v_host_pos, 0, size_t(num_tables) * p.host_pos_stride * sizeof(int32_t), 1);
      }
    }
    if (p.v_sparse_count) {
      so.scount = Add(p.v_sparse_count, 0, size_t(num_tables) * sizeof(int32_t), 1);
    }
    if (p.v_host_count) {
      so.hcount = Add(p.v_host_count, 0, size_t(num_tables) * sizeof(int32_t), 1);
    }
    if (p.v_sum) {
      so.vsum = add_back(p.v_sum, 0, size_t(num_tables) * head_dim * sizeof(float), 1);
      any_vsum_ = true;
    }
    // Hit marks and retained mass: only the window [hits_begin, end) of every table travels,
    // and on the device a table's row is that window.
    const size_t width =
        size_t(std::clamp<int64_t>(end - p.hits_begin, 0, p.hits_stride - p.hits_begin));
    d.pages.hits = nullptr;
    d.pages.hit_mass = nullptr;
    d.pages.hits_stride = static_cast<int32_t>(width);
    if (with_hits && p.hits) {
      so.hits = add_back(p.hits, size_t(p.hits_stride) * sizeof(int32_t), width * sizeof(int32_t),
                         num_tables);
    }
    if (with_hits && p.hit_mass) {
      so.mass = add_back(p.hit_mass, size_t(p.hits_stride) * sizeof(MassUnits),
                         width * sizeof(MassUnits), num_tables);
    }
  }
  copies_off_ = Add(nullptr, 0, copies_.size() * sizeof(DevTableCopy), 1);
  // Copies no step used for a while are freed (a running sequence can sit out a step or two
  // when the token budget runs out; a finished or reset one never comes back).
  std::erase_if(mirrors_, [&](const auto& kv) { return step_ - kv.second.step > kRetainSteps; });
  return used_;
}

size_t DeviceBatch::download_bytes() const {
  size_t n = 0;
  for (const Back& b : back_) n += b.width * b.rows;
  return n;
}

void DeviceBatch::FillStaging(uint8_t* host) const {
  for (const Piece& pc : pieces_) {
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
}

absl::Status DeviceBatch::Upload(const ForwardBatch& batch, int32_t num_tables,
                                 const KvPoolLayout& layout, cudaStream_t stream,
                                 bool with_hits) {
  // The staging buffer is rewritten below: a step that failed after its upload was queued
  // may not have waited for it.
  TS_CUDA_RETURN(cudaStreamSynchronize(stream));
  const size_t used = Plan(batch, num_tables, layout, with_hits);
  absl::Status st = staging_.Reserve(used);
  if (st.ok()) st = device_.Reserve(used);
  for (size_t i = 0; st.ok() && i < allocs_.size(); ++i) {
    // A new array reads -1 where the host's would (entries past the used columns).
    const TableAlloc& a = allocs_[i];
    DeviceBuffer& buf = Buffer(mirrors_.at(a.id), a.array);
    st = buf.Reserve(a.elems * sizeof(int32_t));
    if (st.ok() && a.elems > 0) {
      st = CudaStatus(cudaMemsetAsync(buf.get(), 0xFF, a.elems * sizeof(int32_t), stream),
                      "cudaMemsetAsync");
    }
  }
  if (!st.ok()) {
    mirrors_.clear();  // what they hold is unknown now: the next step sends everything
    return st;
  }
  uint8_t* dev = device_.as<uint8_t>();
  uint8_t* host = staging_.data();

  for (size_t s = 0; s < host_seqs_.size(); ++s) {
    const SeqOffsets& so = seq_offsets_[s];
    SeqPageTables& d = host_seqs_[s].pages;
    if (so.retained != 0) {
      Retained& r = mirrors_.at(so.retained);
      d.k_pages = r.k.as<int32_t>();
      d.v_pages = r.v.as<int32_t>();
      if (d.v_sparse_count) {
        d.v_sparse_pages = r.sparse.pages.as<int32_t>();
        d.v_sparse_pos = r.sparse.pos.as<int32_t>();
      }
      if (d.v_host_count) {
        d.v_host_pages = r.host.pages.as<int32_t>();
        d.v_host_pos = r.host.pos.as<int32_t>();
      }
    } else {
      d.k_pages = reinterpret_cast<const int32_t*>(dev + so.k);
      d.v_pages = reinterpret_cast<const int32_t*>(dev + so.v);
      if (d.v_sparse_count) {
        d.v_sparse_pages = reinterpret_cast<const int32_t*>(dev + so.sp);
        d.v_sparse_pos = reinterpret_cast<const int32_t*>(dev + so.spos);
      }
      if (d.v_host_count) {
        d.v_host_pages = reinterpret_cast<const int32_t*>(dev + so.hp);
        d.v_host_pos = reinterpret_cast<const int32_t*>(dev + so.hpos);
      }
    }
    if (d.v_sparse_count) d.v_sparse_count = reinterpret_cast<const int32_t*>(dev + so.scount);
    if (d.v_host_count) d.v_host_count = reinterpret_cast<const int32_t*>(dev + so.hcount);
    if (d.v_sum) d.v_sum = reinterpret_cast<float*>(dev + so.vsum);
    if (so.hits != kNone) d.hits = reinterpret_cast<int32_t*>(dev + so.hits);
    if (so.mass != kNone) d.hit_mass = reinterpret_cast<MassUnits*>(dev + so.mass);
  }
  FillStaging(host);
  std::memcpy(host + rows_off_, host_rows_.data(), host_rows_.size() * sizeof(DevRow));
  std::memcpy(host + seqs_off_, host_seqs_.data(), host_seqs_.size() * sizeof(DevSeq));
  DevTableCopy* ops = reinterpret_cast<DevTableCopy*>(host + copies_off_);
  for (size_t i = 0; i < copies_.size(); ++i) {
    const TableCopy& c = copies_[i];
    ops[i] = DevTableCopy{Buffer(mirrors_.at(c.id), c.array).as<int32_t>() + c.dst, c.dst_stride,
                          int64_t(c.src / sizeof(int32_t)), c.width, c.rows};
  }
  st = [&]() -> absl::Status {
    TS_CUDA_RETURN(cudaMemcpyAsync(dev, host, used, cudaMemcpyHostToDevice, stream));
    if (!copies_.empty()) {
      int64_t largest = 0;
      for (const TableCopy& c : copies_) largest = std::max(largest, int64_t(c.width) * c.rows);
      TS_CUDA_RETURN(LaunchTableCopies(reinterpret_cast<const DevTableCopy*>(dev + copies_off_),
                                       static_cast<int32_t>(copies_.size()), largest,
                                       reinterpret_cast<const int32_t*>(dev), stream));
    }
    return absl::OkStatus();
  }();
  if (!st.ok()) {
    mirrors_.clear();
    return st;
  }
  tokens_ = reinterpret_cast<const int32_t*>(dev + tokens_off_);
  rows_ = reinterpret_cast<const DevRow*>(dev + rows_off_);
  seqs_ = reinterpret_cast<const DevSeq*>(dev + seqs_off_);
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
