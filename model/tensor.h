// Tensor element types and a non-owning view of a weight tensor as stored on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace thetaserve::model {

// The storage types thetaserve reads. Quantized types are llama.cpp's block formats
// (ggml-common.h); their numeric values are NOT ggml's type ids — gguf_reader.cc maps them.
enum class DType {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

const char* DTypeName(DType t);

// Elements per block (1 for plain float types) and bytes per block.
int64_t BlockElems(DType t);
int64_t BlockBytes(DType t);

// Bytes used by one row of `n` elements; `n` must be a multiple of BlockElems(t).
inline int64_t RowBytes(DType t, int64_t n) { return n / BlockElems(t) * BlockBytes(t); }

// A view of one tensor. Shape is row-major, outermost first ("PyTorch order"): a linear
// layer's weight is {out_features, in_features} and each row of in_features is contiguous.
// GGUF lists dimensions innermost first (ne[0]); readers reverse them into this order.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // points into a mapped file or a buffer the Model owns
  size_t nbytes = 0;

  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape.size() < 2 ? 1 : numel() / shape.back(); }
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + r * RowBytes(dtype, cols());
  }
};

}  // namespace thetaserve::model
