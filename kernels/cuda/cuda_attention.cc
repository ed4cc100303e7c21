#include "kernels/cuda/cuda_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"

namespace thetaserve::kernels::cuda {
namespace {

size_t Align(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

int64_t PlannedLength(int64_t max_len) {
  int64_t step = 256;
  while (step * 16 <= max_len) step *= 2;  // step = 2^(floor(log2 max_len) - 3) past 4,096
  return (std::max<int64_t>(max_len, 1) + step - 1) / step * step;
}

absl::Status CudaAttention::Prepare(const ForwardBatch& batch, const DeviceBatch& db,
                                    const AttnShape& shape, int32_t num_layers,
                                    const TopThetaConfig& config, cudaStream_t stream) {
  shape_ = shape;
  num_layers_ = num_layers;
  ran_.assign(num_layers, false);
  config_ = config;
  if (config.active() && (config.top_k || config.recorder)) {
    return absl::UnimplementedError(
        "exact top-k attention and calibration run on the CPU backend (--device cpu)");
  }
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  const std::vector<DevRow>& rows = db.host_rows();
  num_rows_ = static_cast<int64_t>(rows.size());
  std::vector<int32_t> row_ids;
  std::vector<PrefillTile> tiles;
  int64_t split_max_len = 1;
  sum_len_ = 0;
  for (const DevRow& r : rows) sum_len_ += r.pos + 1;
  // Top-θ's tiles are cut as the mma kernel's (64 query rows).
  theta_tiles_ = config.active() && theta_prefill_ == ThetaPrefill::kTiled;
  tiles_way_ = theta_tiles_ ? PrefillWay::kMma : prefill_way_;
  const bool tiled = !config.active() || theta_tiles_;
  const int32_t tile_tokens = PrefillTileTokens(group, tiles_way_);
  for (int32_t s = 0; s < static_cast<int32_t>(batch.seqs.size()); ++s) {
    const SeqChunk& c = batch.seqs[s];
    if (!tiled || c.num_tokens == 1 || !PrefillSupports(shape.head_dim)) {
      for (int32_t i = 0; i < c.num_tokens; ++i) {
        row_ids.push_back(c.token_offset + i);
        split_max_len = std::max<int64_t>(split_max_len, c.start_pos + i + 1);
      }
    } else {
      for (int32_t i = 0; i < c.num_tokens; i += tile_tokens) {
        tiles.push_back({s, i, std::min(tile_tokens, c.num_tokens - i)});
      }
    }
  }
  // The last tiles of a chunk see the most keys (causal): launched first, they do not finish
  // alone at the end.
  std::reverse(tiles.begin(), tiles.end());
  num_split_rows_ = static_cast<int32_t>(row_ids.size());
  num_tiles_ = static_cast<int32_t>(tiles.size());
  const int64_t planned_len = PlannedLength(split_max_len);
  ThetaPasses passes = config.active() ? theta_passes_ : ThetaPasses::kSplit;
  if (passes == ThetaPasses::kAuto || passes == ThetaPasses::kOnePass) {
    // One pass for pre-softmax thresholds, unless a sequence records the retained mass, whose
    // probabilities need the row's D_full before a key's mass is added.
    bool mass = false;
    for (const SeqChunk& c : batch.seqs) mass |= c.pages.hit_mass != nullptr;
    const bool pre = config.placement() == model::ThetaPlacement::kPreSoftmax;
    passes = pre && !mass ? ThetaPasses::kOnePass : ThetaPasses::kSplit;
  }
  plan_ = PlanSplits(num_split_rows_, shape, planned_len, num_sms_, k_load_, passes);
  plan_.kernel_limit = kernel_limit_;

  // Inputs: row ids, tiles, θ and SDC ratios, counters.
  const int64_t T = num_rows_;
  const int64_t H = shape.num_heads;
  const bool theta = config.active();
  const bool offline = theta && config.sdc == SdcMode::kOffline;
  const size_t ids_bytes = Align(row_ids.size() * sizeof(int32_t));
  const size_t tiles_bytes = Align(tiles.size() * sizeof(PrefillTile));
  const size_t theta_bytes = theta ? Align(size_t(num_layers) * T * H * sizeof(float)) : 0;
  const size_t ratio_bytes = offline ? theta_bytes : 0;
  const size_t counter_bytes = Align(size_t(num_layers) * kThetaCounters * sizeof(unsigned long long));
  const size_t total = ids_bytes + tiles_bytes + theta_bytes + ratio_bytes + counter_bytes;
  if (absl::Status st = staging_.Reserve(total); !st.ok()) return st;
  if (absl::Status st = inputs_.Reserve(total); !st.ok()) return st;
  uint8_t* host = staging_.data();
  uint8_t* dev = inputs_.as<uint8_t>();
  // (A batch without prefill has no tiles; memcpy from an empty vector's null data() is UB.)
  if (!row_ids.empty()) std::memcpy(host, row_ids.data(), row_ids.size() * sizeof(int32_t));
  if (!tiles.empty()) std::memcpy(host + ids_bytes, tiles.data(), tiles.size() * sizeof(PrefillTile));
  size_t off = ids_bytes + tiles_bytes;
  row_ids_ = reinterpret_cast<const int32_t*>(dev);
  tiles_ = reinterpret_cast<const PrefillTile*>(dev + ids_bytes);
  theta_ = sdc_ratio_ = nullptr;
  if (theta) {
    const model::ThetaTable& table = *config.table;
    float* th = reinterpret_cast<float*>(host + off);
    float* ra = offline ? reinterpret_cast<float*>(host + off + theta_bytes) : nullptr;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int32_t l = 0; l < num_layers; ++l) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t L = rows[t].pos + 1;
        const int32_t k = table.KAt(l, L);
        for (int32_t h = 0; h < H; ++h) {
          const size_t i = (size_t(l) * T + t) * H + h;
          th[i] = L > k ? table.Theta(l, h, L) : nan;
          if (ra) ra[i] = L > k ? table.SdcRatio(l, h, L) : 0.0f;
        }
      }
    }
    theta_ = reinterpret_cast<const float*>(dev + off);
    if (offline) sdc_ratio_ = reinterpret_cast<const float*>(dev + off + theta_bytes);
    off += theta_bytes + ratio_bytes;
  }
  std::memset(host + off, 0, counter_bytes);
  counters_ = reinterpret_cast<unsigned long long*>(dev + off);
  TS_CUDA_RETURN(cudaMemcpyAsync(dev, host, total, cudaMemcpyHostToDevice, stream));

  // Workspace for the split kernels, for `row_batch_` rows at a time: every split's partials
  // (o, and four floats) and, for Top-θ's two passes, every row's 16-bit scores. Top-θ may
  // send prefill rows to the split kernels too (ThetaPrefill::kSplit, or a head size the
  // tiles do not take), so a long prefill chunk runs in slices of at most
  // 256 MiB of workspace (one pass keeps no scores: its partials alone would otherwise grow to
  // gigabytes for 8k-token chunks at 128 heads of d 128).
  const int64_t score_stride_pre = theta && !plan_.one_pass ? planned_len : 0;  // a multiple of 256
  const int64_t split_bytes = int64_t(shape.head_dim + 4) * int64_t(sizeof(float));
  const int64_t row_bytes = H * (score_stride_pre * int64_t(sizeof(uint16_t)) +
                                 int64_t(plan_.max_splits) * split_bytes);
  const int64_t row_batch = std::clamp<int64_t>((int64_t(256) << 20) / row_bytes, 1,
                                                std::max<int64_t>(1, num_split_rows_));
  row_batch_ = static_cast<int32_t>(std::min<int64_t>(row_batch, 65535));  // grid.y limit
  const int64_t R = row_batch_;
  const int32_t d = shape.head_dim;
  const int64_t parts = R * H * plan_.max_splits;
  const int64_t score_stride = score_stride_pre;
  // Pass 2 indexes a launch's 16-bit scores in 32 bits (SplitPass2): reached only by a single
  // row of some 2^31 / heads keys (16M at 128 heads), far past any model's context.
  if (R * H * score_stride >= (int64_t(1) << 31)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "Top-θ attention: %d heads × %d keys of 16-bit scores exceed the GPU kernels' 2^31 "
        "index; shorten the context or use dense attention",
        H, score_stride));
  }
  const size_t o_bytes = Align(parts * d * sizeof(float));
  const size_t p_bytes = Align(parts * sizeof(float));
  const size_t stat_bytes = Align(R * H * 3 * sizeof(float));
  const size_t score_bytes = Align(size_t(R) * H * score_stride * sizeof(uint16_t));
  if (absl::Status st = workspace_.Reserve(o_bytes + 4 * p_bytes + stat_bytes + score_bytes);
      !st.ok()) {
    return st;
  }
  uint8_t* w = workspace_.as<uint8_t>();
  ws_.part_o = reinterpret_cast<float*>(w);
  ws_.part_m = reinterpret_cast<float*>(w + o_bytes);
  ws_.part_l = reinterpret_cast<float*>(w + o_bytes + p_bytes);
  ws_.part_n = reinterpret_cast<float*>(w + o_bytes + 2 * p_bytes);
  ws_.part_dk = reinterpret_cast<float*>(w + o_bytes + 3 * p_bytes);
  ws_.row_stat = reinterpret_cast<float*>(w + o_bytes + 4 * p_bytes);
  ws_.scores = reinterpret_cast<uint16_t*>(w + o_bytes + 4 * p_bytes + stat_bytes);
  ws_.score_stride = score_stride;
  ws_.max_splits = plan_.max_splits;
  return absl::OkStatus();
}

absl::Status CudaAttention::Run(int32_t layer, const DeviceBatch& db, const float* q,
                                int64_t q_stride, const KvPoolLayout& layout, const bf16* pool,
                                const float* vsum_rows, float* o, cudaStream_t stream) {
  if (layer < 0 || layer >= num_layers_) {
    return absl::InvalidArgumentError(absl::StrFormat("attention layer %d of %d", layer, num_layers_));
  }
  ran_[layer] = true;
  const DevKv kv{db.rows(), db.seqs(), shape_, layer, layout};
  const DevQueries queries{q, q_stride};
  ThetaArgs args;  // Top-θ's, for the split kernels and the Top-θ prefill tiles
  if (config_.active()) {
    const int64_t layer_off = int64_t(layer) * num_rows_ * shape_.num_heads;
    args.theta = theta_ + layer_off;
    args.sdc_ratio = sdc_ratio_ ? sdc_ratio_ + layer_off : nullptr;
    // The kernels' own dense-row test (L <= k); rows the host found dense by KAt(layer, L)
    // were uploaded with θ = NaN, which keeps everything, and ValidateKSchedule makes the
    // two tests agree.
    args.k = config_.table->k_per_layer[layer];
    args.post_softmax = config_.placement() == model::ThetaPlacement::kPostSoftmax;
    args.sdc = config_.sdc;
    args.vmc = config_.vmc;
    args.retain_factor = config_.retain_factor;
    args.vsum_rows = vsum_rows;
    args.host_pool = host_pool_;
    args.counters = counters_ + kThetaCounters * layer;
  }
  for (int32_t first = 0; first < num_split_rows_; first += row_batch_) {
    const int32_t n = std::min(row_batch_, num_split_rows_ - first);
    TS_CUDA_RETURN(LaunchSplitAttention(row_ids_ + first, n, kv, pool, queries, plan_, ws_,
                                        config_.active() ? &args : nullptr, o, stream));
  }
  if (num_tiles_ > 0 && theta_tiles_) {
    TS_CUDA_RETURN(
        LaunchPrefillThetaAttention(tiles_, num_tiles_, kv, pool, queries, args, o, stream));
  } else if (num_tiles_ > 0) {
    TS_CUDA_RETURN(LaunchPrefillAttention(tiles_, num_tiles_, kv, pool, queries, tiles_way_, o,
                                          stream));
  }
  return absl::OkStatus();
}

std::string CudaAttention::Signature() const {
  return absl::StrFormat(
      "%d/%d/%d/%d/%d/%d/%d/%d/%d/%d/%d/%d/%p/%p/%p/%p/%p/%p/%p/%p/%d/%p/%d/%d/%g/%d/%p",
      num_split_rows_, num_tiles_, int(tiles_way_), int(theta_tiles_), row_batch_, plan_.chunk,
      plan_.max_splits, int(plan_.k_load), int(plan_.fused), int(plan_.one_pass),
      plan_.kernel_limit, num_layers_, row_ids_, tiles_, theta_, sdc_ratio_, counters_,
      ws_.part_o, ws_.row_stat, ws_.scores, int(ws_.score_stride), config_.table,
      int(config_.sdc), int(config_.vmc), config_.retain_factor, int(num_rows_), host_pool_);
}

absl::Status CudaAttention::Finish(AttentionStats* stats, cudaStream_t stream) {
  if (!stats) return absl::OkStatus();
  if (stats->layer_kept.size() < size_t(num_layers_)) stats->Reset(num_layers_);
  // Per layer, every (row, KV head) reads L rows densely and has L · group elements.
  const int64_t dense_rows = sum_len_ * shape_.num_kv_heads;
  const int64_t dense_elems = sum_len_ * shape_.num_heads;
  if (config_.active()) {
    host_counters_.assign(size_t(num_layers_) * kThetaCounters, 0);
    TS_CUDA_RETURN(cudaMemcpyAsync(host_counters_.data(), counters_,
                                   host_counters_.size() * sizeof(unsigned long long),
                                   cudaMemcpyDeviceToHost, stream));
    TS_CUDA_RETURN(cudaStreamSynchronize(stream));
  }
  for (int32_t l = 0; l < num_layers_; ++l) {
    if (!ran_[l]) continue;  // only the layers attention ran for since Prepare
    int64_t read = dense_rows, kept = dense_elems, evicted = 0, from_host = 0;
    if (config_.active()) {
      const unsigned long long* c = host_counters_.data() + size_t(kThetaCounters) * l;
      read = static_cast<int64_t>(c[0]);
      kept = static_cast<int64_t>(c[1]);
      evicted = static_cast<int64_t>(c[2]) - read;
      from_host = static_cast<int64_t>(c[3]);
    }
    stats->v_rows_read += read;
    stats->v_rows_read_host += from_host;
    stats->v_rows_read_dense += dense_rows;
    stats->elements_kept += kept;
    stats->elements_dense += dense_elems;
    stats->retained_but_evicted += evicted;
    stats->layer_kept[l] += kept;
    stats->layer_dense[l] += dense_elems;
  }
  return absl::OkStatus();
}

}  // namespace thetaserve::kernels::cuda
