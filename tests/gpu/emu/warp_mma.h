// CUDA emulator (tests only): kernels/cuda/warp_mma.cuh's warp-wide instructions (PTX mma.sync
// m16n8k16 with bf16 operands and f32 accumulators, ldmatrix .x4 with and without .trans) in
// host C++, from the fragment layouts that header writes down: every lane gives its operands
// (or its row address) to the warp (emu::GatherInWarp), then forms its own share of the
// result. A lane that does not take part stops the test, as must every lane on a GPU
// (.aligned); so does an ldmatrix row address that is not 16-byte aligned. ldmatrix reads
// shared memory once every lane has arrived and before any goes on, as one instruction does.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace emu {

inline float Bf16Bits(uint32_t bits16) {
  const uint32_t u = bits16 << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float LowBf16(uint32_t r) { return Bf16Bits(r & 0xffffu); }
inline float HighBf16(uint32_t r) { return Bf16Bits(r >> 16); }

// lane = 4g + t.
inline int LaneGroup(int lane) { return lane >> 2; }
inline int LaneInGroup(int lane) { return lane & 3; }

}  // namespace emu

// d = a·b + d over the warp's 16×16 A and 16×8 B (kernels/cuda/warp_mma.cuh's layouts).
// Products of bf16 values are exact in f32; the sum runs in k order (a GPU's order may differ
// in the last bits).
inline void MmaBf16M16N8K16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Operands {
    uint32_t a[4];
    uint32_t b[2];
  };
  const Operands mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
  Operands all[32];
  emu::GatherInWarp(&mine, sizeof mine, all);
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = emu::LaneGroup(l), t = emu::LaneInGroup(l);
    const Operands& o = all[l];
    for (int e = 0; e < 2; ++e) {
      const int c = 2 * t + e;
      A[g][c] = e ? emu::HighBf16(o.a[0]) : emu::LowBf16(o.a[0]);
      A[g + 8][c] = e ? emu::HighBf16(o.a[1]) : emu::LowBf16(o.a[1]);
      A[g][c + 8] = e ? emu::HighBf16(o.a[2]) : emu::LowBf16(o.a[2]);
      A[g + 8][c + 8] = e ? emu::HighBf16(o.a[3]) : emu::LowBf16(o.a[3]);
      B[c][g] = e ? emu::HighBf16(o.b[0]) : emu::LowBf16(o.b[0]);
      B[c + 8][g] = e ? emu::HighBf16(o.b[1]) : emu::LowBf16(o.b[1]);
    }
  }
  const int lane = emu::LaneId(), g = emu::LaneGroup(lane), t = emu::LaneInGroup(lane);
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
    d[i] = sum;
  }
}

namespace emu {

// ldmatrix .x4: r[i] = matrix i's (row g, cols 2t..2t+1), or (trans) its (rows 2t..2t+1, col g).
inline void LdMatrixX4Of(uint32_t (&r)[4], const void* row, bool trans) {
  const void* rows[32];
  GatherInWarp(&row, sizeof row, rows, [&] {
    for (int l = 0; l < 32; ++l) {
      if (reinterpret_cast<uintptr_t>(rows[l]) % 16 != 0) {
        std::fprintf(stderr, "emu: ldmatrix row address %p (lane %d) is not 16-byte aligned\n",
                     rows[l], l);
        std::abort();
      }
    }
    const int lane = LaneId(), g = LaneGroup(lane), t = LaneInGroup(lane);
    for (int i = 0; i < 4; ++i) {
      uint16_t lo, hi;
      if (trans) {
        std::memcpy(&lo, static_cast<const char*>(rows[8 * i + 2 * t]) + 2 * g, 2);
        std::memcpy(&hi, static_cast<const char*>(rows[8 * i + 2 * t + 1]) + 2 * g, 2);
      } else {
        std::memcpy(&lo, static_cast<const char*>(rows[8 * i + g]) + 4 * t, 2);
        std::memcpy(&hi, static_cast<const char*>(rows[8 * i + g]) + 4 * t + 2, 2);
      }
      r[i] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  });
}

}  // namespace emu

inline void LdMatrixX4(uint32_t (&r)[4], const void* row) { emu::LdMatrixX4Of(r, row, false); }
inline void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  emu::LdMatrixX4Of(r, row, true);
}
