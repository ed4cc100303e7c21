// CUDA emulator (tests only): the warp matrix functions (nvcuda::wmma) kernels/cuda uses, for
// 16×16×16 bf16 tiles with f32 accumulators. A fragment's element layout is unspecified in
// CUDA, so a kernel may only fill, load, store and multiply fragments (and scale every element
// alike); here every lane holds the whole tile, and each lane's call computes it alone. Loads
// read memory at the lane's call, with no exchange between lanes, so a lane that loads a tile
// before another lane of its warp wrote its share (a missing __syncwarp) reads what was there.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "cuda_bf16.h"

namespace nvcuda::wmma {

// A pointer or leading dimension the hardware refuses (the pointer 256-bit aligned, ldm a
// multiple of 16 bytes): stops the test, as a GPU's misaligned-address error would.
inline void CheckTile(const void* p, unsigned ldm, size_t element_bytes, const char* what) {
  if (reinterpret_cast<size_t>(p) % 32 != 0 || (ldm * element_bytes) % 16 != 0) {
    std::fprintf(stderr, "emu: wmma %s of a tile at %p with ldm %u: misaligned\n", what, p, ldm);
    std::abort();
  }
}

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment;

// The tile as floats, row-major: matrix_a M×K, matrix_b K×N, accumulator M×N.
template <int R, int C>
struct Tile {
  static constexpr int num_elements = R * C;
  float x[R * C];
};

template <typename Layout>
struct fragment<matrix_a, 16, 16, 16, __nv_bfloat16, Layout> : Tile<16, 16> {};
template <typename Layout>
struct fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Layout> : Tile<16, 16> {};
template <>
struct fragment<accumulator, 16, 16, 16, float, void> : Tile<16, 16> {};

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float v) {
  for (float& e : f.x) e = v;
}

// Element (r, c) of a row_major operand is at p[r · ldm + c], of a col_major one at
// p[c · ldm + r]. ldm: a multiple of 8 elements for bf16 operands, of 4 for f32 (as on a GPU).
template <typename Use, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p,
                      unsigned ldm) {
  CheckTile(p, ldm, 2, "load");
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      const size_t at = std::is_same_v<Layout, row_major> ? size_t(r) * ldm + c : size_t(c) * ldm + r;
      f.x[r * 16 + c] = __bfloat162float(p[at]);
    }
  }
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  CheckTile(p, ldm, 4, "load");
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      f.x[r * 16 + c] = layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r];
    }
  }
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  CheckTile(p, ldm, 4, "store");
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      (layout == mem_row_major ? p[size_t(r) * ldm + c] : p[size_t(c) * ldm + r]) = f.x[r * 16 + c];
    }
  }
}

// d = a · b + c, products and sums in f32 (bf16 operands are exact in f32).
template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  float out[256];
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 16; ++n) {
      float s = c.x[r * 16 + n];
      for (int k = 0; k < 16; ++k) s += a.x[r * 16 + k] * b.x[k * 16 + n];
      out[r * 16 + n] = s;
    }
  }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
