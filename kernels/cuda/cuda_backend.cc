#include "kernels/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_attention.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_batch.h"
#include "kernels/cuda/device_memory.h"
#include "model/quant.h"

namespace thetaserve::kernels::cuda {
namespace {

std::atomic<int64_t> graphs_captured{0};

// cuBLAS is loaded with dlopen(RTLD_LOCAL) when the first CUDA backend is created, not linked:
// as a global DT_NEEDED library its symbols interposed on civetweb's (the metrics server failed
// to start in every thetaserve process, GPU or not), and a CPU-only run should not load 700 MB
// of GPU libraries anyway.
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*,
                            cudaDataType, int, const void*, void*, cudaDataType, int,
                            cublasComputeType_t, cublasGemmAlgo_t);
  const char* (*status_string)(cublasStatus_t);
};

// The pointers have exactly the types of the functions the header declares.
static_assert(std::is_same_v<decltype(CublasApi::create), decltype(&cublasCreate_v2)>);
static_assert(std::is_same_v<decltype(CublasApi::destroy), decltype(&cublasDestroy_v2)>);
static_assert(std::is_same_v<decltype(CublasApi::set_stream), decltype(&cublasSetStream_v2)>);
static_assert(std::is_same_v<decltype(CublasApi::set_workspace), decltype(&cublasSetWorkspace_v2)>);
// (cublasGemmEx is overloaded: the conversion picks the declaration with exactly this type.)
[[maybe_unused]] constexpr decltype(CublasApi::gemm_ex) kGemmExHasThisType = &cublasGemmEx;
static_assert(std::is_same_v<decltype(CublasApi::status_string), decltype(&cublasGetStatusString)>);

absl::StatusOr<const CublasApi*> LoadCublas() {
  static absl::StatusOr<const CublasApi*> api = []() -> absl::StatusOr<const CublasApi*> {
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13",
                             "/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      tried += std::string(tried.empty() ? "" : "; ") + dlerror();
    }
    if (!lib) return absl::UnavailableError("cannot load cuBLAS: " + tried);
    auto* a = new CublasApi;
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      ok &= fn != nullptr;
    };
    sym(a->create, "cublasCreate_v2");
    sym(a->destroy, "cublasDestroy_v2");
    sym(a->set_stream, "cublasSetStream_v2");
    sym(a->set_workspace, "cublasSetWorkspace_v2");
    sym(a->gemm_ex, "cublasGemmEx");
    sym(a->status_string, "cublasGetStatusString");
    if (!ok) return absl::UnavailableError("libcublas.so.13 lacks a function thetaserve needs");
    return a;
  }();
  return api;
}

#define TS_CUBLAS_RETURN(expr)                                                          \
  do {                                                                                  \
    if (cublasStatus_t ts_st_ = (expr); ts_st_ != CUBLAS_STATUS_SUCCESS)                \
      return absl::InternalError(absl::StrFormat("cuBLAS error in %s: %s", #expr,       \
                                                 cublas_->status_string(ts_st_)));      \
  } while (0)

// A weight matrix [rows, cols] in bf16 on the device.
struct DevMatrix {
  DeviceBuffer buf;
  const bf16* ptr = nullptr;  // buf's, or another matrix's (tied embeddings)
  int64_t rows = 0, cols = 0;
};

// Appends the tensor's rows, dequantized and rounded to bf16, to `out`.
void AppendBf16Rows(const model::TensorView& t, std::vector<bf16>& out) {
  const int64_t rows = t.rows(), cols = t.cols();
  const size_t base = out.size();
  out.resize(base + size_t(rows) * cols);
  if (t.dtype == model::DType::kBF16) {
    std::memcpy(out.data() + base, t.data, size_t(rows) * cols * sizeof(bf16));
    return;
  }
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    model::DequantizeRow(t.dtype, t.row(r), row.data(), cols);
    bf16* dst = out.data() + base + size_t(r) * cols;
    for (int64_t c = 0; c < cols; ++c) dst[c] = model::FloatToBF16(row[c]);
  }
}

absl::Status Upload(const void* src, size_t bytes, DeviceBuffer& dst) {
  if (absl::Status st = dst.Reserve(bytes); !st.ok()) return st;
  TS_CUDA_RETURN(cudaMemcpy(dst.get(), src, bytes, cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status UploadMatrix(std::initializer_list<const model::TensorView*> parts, DevMatrix& m) {
  std::vector<bf16> host;
  m.rows = 0;
  m.cols = (*parts.begin())->cols();
  for (const model::TensorView* t : parts) {
    if (t->cols() != m.cols) {
      return absl::InternalError(absl::StrFormat("tensor %s has %d columns, expected %d",
                                                 t->name, t->cols(), m.cols));
    }
    AppendBf16Rows(*t, host);
    m.rows += t->rows();
  }
  if (absl::Status st = Upload(host.data(), host.size() * sizeof(bf16), m.buf); !st.ok()) {
    return st;
  }
  m.ptr = m.buf.as<bf16>();
  return absl::OkStatus();
}

absl::Status UploadF32(const model::TensorView& t, DeviceBuffer& dst) {
  if (t.dtype != model::DType::kF32) {
    return absl::InternalError(absl::StrFormat("%s: expected an f32 vector", t.name));
  }
  return Upload(t.data, size_t(t.numel()) * sizeof(float), dst);
}

// Top-θ's pass 2 names a pool row by a 31-bit index (kernels/cuda/split_keep.cuh, kHostRow).
constexpr int64_t kMaxPoolRows = int64_t(1) << 31;

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const model::Model& model) : Backend(model), attention_(1) {}
  ~CudaBackend() override {
    DropGraphs();
    if (handle_) cublas_->destroy(handle_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  absl::Status Init();
  std::string name() const override { return "cuda"; }
  KvDtype kv_dtype() const override { return KvDtype::kBf16; }
  std::string matmul_activations() const override { return "bf16"; }
  absl::Status AllocateKvPool(int64_t num_pages, int32_t block_size) override;
  absl::Status Forward(const ForwardBatch& batch, float* logits) override;
  bool ReturnsArgmax() const override { return true; }
  absl::StatusOr<float*> LogitsBuffer(int64_t floats) override {
    if (absl::Status st = host_logits_.Reserve(size_t(floats) * sizeof(float)); !st.ok()) return st;
    return reinterpret_cast<float*>(host_logits_.data());
  }
  absl::Status AllocateHostPool(int64_t num_pages) override;
  absl::Status CopyKvRows(std::span<const KvRowCopy> copies) override {
    return RunRowCopies(copies, /*to_host=*/false);
  }
  absl::Status OffloadKvRows(std::span<const KvRowCopy> copies) override {
    return RunRowCopies(copies, /*to_host=*/true);
  }
  absl::Status SumVRows(const SeqPageTables& pages, int64_t length) override;
  std::optional<int64_t> FreeMemoryBytes() const override {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return std::nullopt;
    }
    return static_cast<int64_t>(free);
  }
  std::optional<int64_t> MaxPoolRows() const override { return kMaxPoolRows; }

 private:
  struct Layer {
    DevMatrix wqkv, wo, wgu, wdown;
    DeviceBuffer bqkv, attn_norm, ffn_norm;
    bool has_bias = false;
  };
  // y [T, w.rows] = x [T, w.cols] · wᵀ (+ y when accumulate).
  absl::Status Gemm(const bf16* x, int64_t T, const DevMatrix& w, float* y, bool accumulate);
  absl::Status Reserve(int64_t T, int64_t logit_rows);
  // Uploads `copies`, checked against the pool (the host pool when to_host), and runs them:
  // in order inside the pool, or independently into the host pool; waits for them.
  absl::Status RunRowCopies(std::span<const KvRowCopy> copies, bool to_host);
  // Every kernel of one step (embedding to logits), on stream_, no host work: what a CUDA
  // graph captures.
  absl::Status LaunchStep(int64_t T, int64_t R, bool vmc_rows);
  // Replays (capturing first if new) the graph of a decode step with this signature.
  absl::Status LaunchStepGraph(int64_t T, int64_t R, bool vmc_rows);
  // The captured graphs hold the pools' addresses and layout (the block size is not in their
  // keys): a new pool, which may land at the old address, drops them.
  void DropGraphs() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
  }

  cudaStream_t stream_ = nullptr;
  const CublasApi* cublas_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  AttnShape shape_;
  std::vector<Layer> layers_;
  DevMatrix embed_, output_;
  DeviceBuffer output_norm_, inv_freq_;
  DeviceBuffer pool_;
  MappedHostBuffer host_pool_;  // the offload policy's V rows
  DeviceBatch batch_;
  CudaAttention attention_;
  // Activations, grown to the largest step.
  DeviceBuffer x_, hb_, qkv_, attn_, attn_bf_, gu_, act_, vsum_rows_, logits_, logit_rows_;
  DeviceBuffer argmax_;       // [logit rows] int32: ForwardBatch::argmax's picks
  PinnedBuffer host_argmax_;  // their copy back (page-locked: the copy stays asynchronous)
  std::vector<int32_t> host_logit_rows_;
  PinnedBuffer host_logits_;  // LogitsBuffer
  DeviceBuffer copies_;
  DeviceBuffer cublas_workspace_;
  // Decode steps replay CUDA graphs keyed by everything they depend on (THETASERVE_CUDA_GRAPHS=0
  // turns this off; a failed capture turns it off for the process).
  bool graphs_enabled_ = true;
  std::vector<std::pair<std::string, cudaGraphExec_t>> graphs_;  // most recent last
};

absl::Status CudaBackend::Init() {
  const model::ModelConfig& c = model_->config();
  const model::ModelWeights& w = model_->weights();
  if (c.head_dim != 16 && c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128) {
    return absl::UnimplementedError(absl::StrFormat(
        "the CUDA attention kernels support head_dim 16, 32, 64 and 128; this model has %d",
        c.head_dim));
  }
  if (c.num_heads % c.num_kv_heads != 0 || c.num_heads / c.num_kv_heads > 8) {
    return absl::UnimplementedError(absl::StrFormat(
        "the CUDA attention kernels support up to 8 query heads per KV head (model: %d / %d)",
        c.num_heads, c.num_kv_heads));
  }
  TS_CUDA_RETURN(cudaSetDevice(0));
  cudaDeviceProp prop;
  TS_CUDA_RETURN(cudaGetDeviceProperties(&prop, 0));
  attention_.set_num_sms(prop.multiProcessorCount);
  TS_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  auto api = LoadCublas();
  if (!api.ok()) return api.status();
  cublas_ = *api;
  TS_CUBLAS_RETURN(cublas_->create(&handle_));
  TS_CUBLAS_RETURN(cublas_->set_stream(handle_, stream_));
  // A fixed workspace, so cuBLAS allocates nothing while a graph is being captured.
  if (absl::Status st = cublas_workspace_.Reserve(size_t(32) << 20); !st.ok()) return st;
  TS_CUBLAS_RETURN(cublas_->set_workspace(handle_, cublas_workspace_.get(), cublas_workspace_.bytes()));
  if (const char* g = std::getenv("THETASERVE_CUDA_GRAPHS"); g && std::string(g) == "0") {
    graphs_enabled_ = false;
  }
  shape_ = AttnShape{static_cast<int32_t>(c.num_heads), static_cast<int32_t>(c.num_kv_heads),
                     static_cast<int32_t>(c.head_dim), 1.0f / std::sqrt(float(c.head_dim))};

  layers_.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const model::LayerWeights& lw = w.layers[l];
    Layer& d = layers_[l];
    absl::Status st = UploadMatrix({&lw.wq, &lw.wk, &lw.wv}, d.wqkv);
    if (st.ok()) st = UploadMatrix({&lw.wo}, d.wo);
    if (st.ok()) st = UploadMatrix({&lw.w_gate, &lw.w_up}, d.wgu);
    if (st.ok()) st = UploadMatrix({&lw.w_down}, d.wdown);
    if (st.ok()) st = UploadF32(lw.attn_norm, d.attn_norm);
    if (st.ok()) st = UploadF32(lw.ffn_norm, d.ffn_norm);
    if (st.ok() && !lw.bq.empty()) {
      std::vector<float> bias;
      for (const model::TensorView* b : {&lw.bq, &lw.bk, &lw.bv}) {
        const float* p = static_cast<const float*>(b->data);
        bias.insert(bias.end(), p, p + b->numel());
      }
      st = Upload(bias.data(), bias.size() * sizeof(float), d.bqkv);
      d.has_bias = true;
    }
    if (!st.ok()) return st;
  }
  if (absl::Status st = UploadMatrix({&w.tok_embeddings}, embed_); !st.ok()) return st;
  if (w.output.data == w.tok_embeddings.data) {
    output_.ptr = embed_.ptr;  // tied
    output_.rows = embed_.rows;
    output_.cols = embed_.cols;
  } else if (absl::Status st = UploadMatrix({&w.output}, output_); !st.ok()) {
    return st;
  }
  if (absl::Status st = UploadF32(w.output_norm, output_norm_); !st.ok()) return st;
  const cpu::Rope rope(c);
  if (absl::Status st = Upload(rope.inv_freq().data(), rope.inv_freq().size() * sizeof(float), inv_freq_);
      !st.ok()) {
    return st;
  }
  TS_CUDA_RETURN(cudaDeviceSynchronize());  // uploads done before the first step's stream
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateKvPool(int64_t num_pages, int32_t block_size) {
  if (num_pages * block_size > kMaxPoolRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a KV pool of %d pages of %d rows exceeds the CUDA kernels' 2^31 rows; use a smaller "
        "--kv-cache-memory", num_pages, block_size));
  }
  DropGraphs();
  if (absl::Status st = SetKvLayout(num_pages, block_size); !st.ok()) return st;
  host_pool_.Free();
  attention_.set_host_pool(nullptr);
  const size_t bytes = size_t(num_pages) * kv_layout_.PageElems() * sizeof(bf16);
  pool_ = DeviceBuffer();
  if (absl::Status st = pool_.Reserve(bytes); !st.ok()) return st;
  TS_CUDA_RETURN(cudaMemsetAsync(pool_.get(), 0, bytes, stream_));
  TS_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateHostPool(int64_t num_pages) {
  DropGraphs();
  host_pool_.Free();
  attention_.set_host_pool(nullptr);
  if (num_pages * kv_layout_.block_size > kMaxPoolRows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a host pool of %d pages of %d rows exceeds the CUDA kernels' 2^31 rows; use a smaller "
        "--offload-memory", num_pages, kv_layout_.block_size));
  }
  if (absl::Status st = SetHostLayout(num_pages); !st.ok()) return st;
  absl::Status st = host_pool_.Allocate(size_t(num_pages) * kv_layout_.PageElems() * sizeof(bf16));
  if (!st.ok()) {
    kv_layout_.num_host_pages = 0;
    return st;
  }
  attention_.set_host_pool(host_pool_.device<bf16>());
  return absl::OkStatus();
}

absl::Status CudaBackend::RunRowCopies(std::span<const KvRowCopy> copies, bool to_host) {
  if (copies.empty()) return absl::OkStatus();
  if (absl::Status st = CheckKvRowCopies(copies, to_host); !st.ok()) return st;
  const size_t bytes = copies.size() * sizeof(KvRowCopy);
  if (absl::Status st = copies_.Reserve(bytes); !st.ok()) return st;
  TS_CUDA_RETURN(cudaMemcpyAsync(copies_.get(), copies.data(), bytes, cudaMemcpyHostToDevice,
                                 stream_));
  const int32_t n = static_cast<int32_t>(copies.size());
  if (to_host) {
    TS_CUDA_RETURN(LaunchOffloadKvRows(copies_.as<KvRowCopy>(), n, kv_layout_, pool_.as<bf16>(),
                                       host_pool_.device<bf16>(), stream_));
  } else {
    TS_CUDA_RETURN(LaunchCopyKvRows(copies_.as<KvRowCopy>(), n, kv_layout_, pool_.as<bf16>(), stream_));
  }
  TS_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::SumVRows(const SeqPageTables& pages, int64_t length) {
  if (!pages.v_sum) return absl::OkStatus();
  if (pages.v_tail_start != 0) {
    return absl::FailedPreconditionError("SumVRows needs the dense V tail from position 0");
  }
  const auto& c = model_->config();
  const int64_t tables = int64_t(c.num_layers) * c.num_kv_heads;
  const int64_t blocks = (length + kv_layout_.block_size - 1) / kv_layout_.block_size;
  std::vector<int32_t> ids(tables * blocks);
  for (int64_t t = 0; t < tables; ++t) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int32_t page = pages.v_pages[t * pages.stride + b];
      if (page < 0 || page >= kv_layout_.num_pages) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "V page %d of table %d, block %d, is outside the pool", page, t, b));
      }
      ids[t * blocks + b] = page;
    }
  }
  const size_t id_bytes = ids.size() * sizeof(int32_t);
  const size_t sum_bytes = size_t(tables) * kv_layout_.head_dim * sizeof(float);
  if (absl::Status st = copies_.Reserve(id_bytes + sum_bytes); !st.ok()) return st;
  auto* dev_ids = copies_.as<int32_t>();
  auto* dev_sum = reinterpret_cast<float*>(copies_.as<char>() + id_bytes);
  TS_CUDA_RETURN(cudaMemcpyAsync(dev_ids, ids.data(), id_bytes, cudaMemcpyHostToDevice, stream_));
  TS_CUDA_RETURN(LaunchSumVRows(dev_ids, static_cast<int32_t>(tables), length, kv_layout_,
                                pool_.as<bf16>(), dev_sum, stream_));
  TS_CUDA_RETURN(cudaMemcpyAsync(pages.v_sum, dev_sum, sum_bytes, cudaMemcpyDeviceToHost, stream_));
  TS_CUDA_RETURN(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Gemm(const bf16* x, int64_t T, const DevMatrix& w, float* y,
                               bool accumulate) {
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // Row-major y[T, N] = x[T, K] · W[N, K]ᵀ is column-major yᵀ[N, T] = W[K, N]ᵀ · xᵀ[K, T].
  TS_CUBLAS_RETURN(cublas_->gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(w.rows), int(T),
                                int(w.cols), &alpha, w.ptr, CUDA_R_16BF, int(w.cols), x,
                                CUDA_R_16BF, int(w.cols), &beta, y, CUDA_R_32F, int(w.rows),
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaBackend::Reserve(int64_t T, int64_t logit_rows) {
  const auto& c = model_->config();
  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  absl::Status st = x_.Reserve(T * c.hidden_size * sizeof(float));
  if (st.ok()) st = hb_.Reserve(T * c.hidden_size * sizeof(bf16));
  if (st.ok()) st = qkv_.Reserve(T * qkv_dim * sizeof(float));
  if (st.ok()) st = attn_.Reserve(T * c.q_dim() * sizeof(float));
  if (st.ok()) st = attn_bf_.Reserve(T * c.q_dim() * sizeof(bf16));
  if (st.ok()) st = gu_.Reserve(T * 2 * c.intermediate_size * sizeof(float));
  if (st.ok()) st = act_.Reserve(T * c.intermediate_size * sizeof(bf16));
  if (st.ok()) st = vsum_rows_.Reserve(T * c.kv_dim() * sizeof(float));
  if (st.ok()) st = logits_.Reserve(std::max<int64_t>(1, logit_rows) * c.vocab_size * sizeof(float));
  if (st.ok()) st = logit_rows_.Reserve(std::max<int64_t>(1, logit_rows) * sizeof(int32_t));
  if (st.ok()) st = argmax_.Reserve(std::max<int64_t>(1, logit_rows) * sizeof(int32_t));
  if (st.ok()) st = host_argmax_.Reserve(std::max<int64_t>(1, logit_rows) * sizeof(int32_t));
  return st;
}

absl::Status CudaBackend::LaunchStep(int64_t T, int64_t R, bool vmc_rows) {
  const model::ModelConfig& c = model_->config();
  const int64_t hidden = c.hidden_size;
  const int64_t qkv_dim = c.q_dim() + 2 * c.kv_dim();
  const float eps = c.rms_norm_eps;
  float* x = x_.as<float>();
  bf16* hb = hb_.as<bf16>();
  float* qkv = qkv_.as<float>();
  bf16* pool = pool_.as<bf16>();

  TS_CUDA_RETURN(LaunchEmbed(embed_.ptr, batch_.tokens(), T, hidden, x, stream_));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    const int32_t layer = static_cast<int32_t>(l);
    TS_CUDA_RETURN(LaunchRmsNormBf16(x, nullptr, L.attn_norm.as<float>(), T, hidden, eps, hb, stream_));
    if (absl::Status st = Gemm(hb, T, L.wqkv, qkv, false); !st.ok()) return st;
    const DevKv kv{batch_.rows(), batch_.seqs(), shape_, layer, kv_layout_};
    TS_CUDA_RETURN(LaunchRopeWriteKv(qkv, L.has_bias ? L.bqkv.as<float>() : nullptr, T, kv,
                                     inv_freq_.as<float>(), c.rope_interleaved, pool, stream_));
    if (batch_.any_vsum()) {
      TS_CUDA_RETURN(LaunchVSum(qkv, kv, batch_.num_seqs(),
                                vmc_rows ? vsum_rows_.as<float>() : nullptr, stream_));
    }
    if (absl::Status st = attention_.Run(layer, batch_, qkv, qkv_dim, kv_layout_, pool,
                                         vmc_rows ? vsum_rows_.as<float>() : nullptr,
                                         attn_.as<float>(), stream_);
        !st.ok()) {
      return st;
    }
    TS_CUDA_RETURN(LaunchF32ToBf16(attn_.as<float>(), T * c.q_dim(), attn_bf_.as<bf16>(), stream_));
    if (absl::Status st = Gemm(attn_bf_.as<bf16>(), T, L.wo, x, true); !st.ok()) return st;
    TS_CUDA_RETURN(LaunchRmsNormBf16(x, nullptr, L.ffn_norm.as<float>(), T, hidden, eps, hb, stream_));
    if (absl::Status st = Gemm(hb, T, L.wgu, gu_.as<float>(), false); !st.ok()) return st;
    TS_CUDA_RETURN(LaunchSiluMul(gu_.as<float>(), T, c.intermediate_size, act_.as<bf16>(), stream_));
    if (absl::Status st = Gemm(act_.as<bf16>(), T, L.wdown, x, true); !st.ok()) return st;
  }
  if (R > 0) {
    TS_CUDA_RETURN(LaunchRmsNormBf16(x, logit_rows_.as<int32_t>(), output_norm_.as<float>(), R,
                                     hidden, eps, hb, stream_));
    if (absl::Status st = Gemm(hb, R, output_, logits_.as<float>(), false); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::LaunchStepGraph(int64_t T, int64_t R, bool vmc_rows) {
  const std::string key = absl::StrFormat(
      "%d/%d/%d/%d/%d/%p/%p/%p/%p/%p/%p/%p/%p/%p/%p/%p/%p/%p/%p/%s", T, R, int(vmc_rows),
      int(batch_.any_vsum()), batch_.num_seqs(), batch_.tokens(), batch_.rows(), batch_.seqs(),
      x_.get(), hb_.get(), qkv_.get(), attn_.get(), attn_bf_.get(), gu_.get(), act_.get(),
      vsum_rows_.get(), logits_.get(), logit_rows_.get(), pool_.get(), attention_.Signature());
  auto it = std::find_if(graphs_.begin(), graphs_.end(), [&](const auto& g) { return g.first == key; });
  if (it == graphs_.end()) {
    TS_CUDA_RETURN(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    absl::Status st = LaunchStep(T, R, vmc_rows);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    cudaError_t inst = cudaErrorUnknown;
    if (st.ok() && end == cudaSuccess) inst = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (!st.ok() || end != cudaSuccess || inst != cudaSuccess) {
      // Not capturable here: run the step directly from now on.
      cudaGetLastError();
      graphs_enabled_ = false;
      std::fprintf(stderr, "cuda: CUDA graph capture failed (%s); decode steps launch directly\n",
                   !st.ok() ? std::string(st.message()).c_str()
                            : cudaGetErrorString(end != cudaSuccess ? end : inst));
      return LaunchStep(T, R, vmc_rows);
    }
    if (graphs_.size() >= 64) {  // evict the least recently used
      cudaGraphExecDestroy(graphs_.front().second);
      graphs_.erase(graphs_.begin());
    }
    graphs_.emplace_back(key, exec);
    graphs_captured.fetch_add(1, std::memory_order_relaxed);
    it = graphs_.end() - 1;
  } else if (it != graphs_.end() - 1) {
    std::rotate(it, it + 1, graphs_.end());  // most recent last
    it = graphs_.end() - 1;
  }
  attention_.MarkAllLayersRan();
  TS_CUDA_RETURN(cudaGraphLaunch(it->second, stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Forward(const ForwardBatch& batch, float* logits) {
  const model::ModelConfig& c = model_->config();
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  if (T == 0) return absl::OkStatus();
  if (pool_.get() == nullptr) return absl::FailedPreconditionError("KV pool not allocated");
  if (absl::Status st = CheckDenseV(batch); !st.ok()) return st;
  for (int32_t tok : batch.tokens) {
    if (tok < 0 || tok >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("token id %d outside the vocabulary [0, %d)", tok, c.vocab_size));
    }
  }
  // Rows whose logits are wanted, in sequence order.
  host_logit_rows_.clear();
  for (const SeqChunk& seq : batch.seqs) {
    if (batch.all_logits || seq.all_logits) {
      for (int32_t i = 0; i < seq.num_tokens; ++i) host_logit_rows_.push_back(seq.token_offset + i);
    } else if (seq.want_logits && seq.num_tokens > 0) {
      host_logit_rows_.push_back(seq.token_offset + seq.num_tokens - 1);
    }
  }
  const int64_t R = static_cast<int64_t>(host_logit_rows_.size());
  if (absl::Status st = Reserve(T, R); !st.ok()) return st;
  const int32_t tables = static_cast<int32_t>(c.num_layers * c.num_kv_heads);
  if (absl::Status st = batch_.Upload(batch, tables, kv_layout_, stream_, top_theta_.active());
      !st.ok()) {
    return st;
  }
  if (absl::Status st = attention_.Prepare(batch, batch_, shape_, c.num_layers, top_theta_,
                                           stream_);
      !st.ok()) {
    return st;
  }
  const bool vmc_rows = top_theta_.active() && top_theta_.vmc && batch_.any_vsum();
  if (R > 0) {
    TS_CUDA_RETURN(cudaMemcpyAsync(logit_rows_.get(), host_logit_rows_.data(), R * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream_));
  }
  bool decode_only = graphs_enabled_;
  for (const SeqChunk& seq : batch.seqs) decode_only &= seq.num_tokens == 1;
  if (absl::Status st = decode_only ? LaunchStepGraph(T, R, vmc_rows) : LaunchStep(T, R, vmc_rows);
      !st.ok()) {
    return st;
  }
  if (R > 0 && batch.argmax) {
    // The greedy picks instead of the rows: R ids back, not R · vocab floats (after the step's
    // graph, which stays the same whichever the step wants).
    TS_CUDA_RETURN(LaunchArgmaxRows(logits_.as<float>(), R, c.vocab_size, argmax_.as<int32_t>(),
                                    stream_));
    TS_CUDA_RETURN(cudaMemcpyAsync(host_argmax_.data(), argmax_.get(), R * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream_));
  } else if (R > 0) {
    TS_CUDA_RETURN(cudaMemcpyAsync(logits, logits_.get(), R * c.vocab_size * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
  }
  if (absl::Status st = batch_.Download(stream_); !st.ok()) return st;  // synchronizes
  if (R > 0 && batch.argmax) std::memcpy(batch.argmax, host_argmax_.data(), R * sizeof(int32_t));
  TS_CUDA_RETURN(cudaGetLastError());
  return attention_.Finish(batch.stats, stream_);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const model::Model& model) {
  if (DeviceCount() == 0) {
    return absl::UnavailableError("no CUDA device is visible; use --device cpu");
  }
  auto backend = std::make_unique<CudaBackend>(model);
  if (absl::Status st = backend->Init(); !st.ok()) return st;
  return std::unique_ptr<Backend>(std::move(backend));
}

int64_t GraphsCaptured() { return graphs_captured.load(std::memory_order_relaxed); }

}  // namespace thetaserve::kernels::cuda
