// Warp-wide tensor-core instructions as PTX (PTX ISA, "Warp-level matrix instructions"), for
// kernels that keep their matrix fragments in registers: mma.sync m16n8k16 (bf16 operands, f32
// accumulators) and ldmatrix (four 8×8 matrices of 16-bit elements from shared memory). Every
// lane of the warp executes each of them (.aligned). Fragment layouts, with lane = 4·g + t
// (g = lane / 4, t = lane % 4) and a register holding two elements, the lower index in its low
// 16 bits:
//   A (16×16, row-major): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 8+2t..),
//                         a[3] = (g+8, 8+2t..)                                     (row, col)
//   B (16×8, k × n):      b0 = (2t..2t+1, g), b1 = (8+2t..8+2t+1, g)
//   C, D (16×8, f32):     d[0..1] = (g, 2t..2t+1), d[2..3] = (g+8, 2t..2t+1)
// ldmatrix: lanes 8i..8i+7 give the addresses of matrix i's rows 0..7 (16 bytes each, 16-byte
// aligned, shared memory); r[i] = matrix i's (row g, cols 2t..2t+1), or with .trans its
// (rows 2t..2t+1, col g).
// Compiled by nvcc as inline PTX; the CUDA emulator (tests/gpu/emu/warp_mma.h, through its
// cuda_runtime.h) defines the same functions in host C++ from these layouts.
#pragma once

#include <cstdint>

#ifdef __CUDACC__

// d = a·b + d.
__device__ __forceinline__ void MmaBf16M16N8K16(float (&d)[4], const uint32_t (&a)[4],
                                                uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// r[i] = matrix i's (row g, cols 2t..2t+1); `row`: this lane's row address.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// r[i] = matrix i's (rows 2t..2t+1, col g): the transposed matrix's (row g, cols 2t..2t+1).
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* row) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

#endif  // __CUDACC__
