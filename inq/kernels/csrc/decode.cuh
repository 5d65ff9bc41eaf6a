// Device helpers shared by the inq kernels: decoding power-of-two codes and loading activations.
//
// A code (see inq/pow2.py) is 0 for a zero weight, else `1 s o` (top bit set, sign bit, exponent
// offset o in the low bits-2 bits) for the weight (-1)^s * 2^(n1 - o). Every kernel decodes the
// *relative* weight (-1)^s * 2^(-o) (or a fixed power-of-two multiple of it) by placing sign and
// exponent bits into a float, accumulates in fp32, and applies 2^n1 once at the end (scalbnf,
// exact). No multiplier ever sees the weight's magnitude except as a bit pattern.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace inq {

// ---------------------------------------------------------------------------------------------
// Scalar decode (byte codes, any bits): fp32 bit pattern built from the code's fields.
// ---------------------------------------------------------------------------------------------

// (-1)^s * 2^(-o) as fp32, and +0.0f for code 0. Branch-free: the exponent field is
// nz * 127 - o, which is 0 for code 0 (nz = 0 and o = 0 there) and 127 - o for a weight.
__device__ __forceinline__ float decode_relative_f32(uint32_t code, int bits) {
  const uint32_t nz = code >> (bits - 1);
  const uint32_t s = (code >> (bits - 2)) & 1u;
  const uint32_t o = code & ((1u << (bits - 2)) - 1u);
  return __uint_as_float((s << 31) | ((nz * 127u - o) << 23));
}

// ---------------------------------------------------------------------------------------------
// Nibble decode with byte permutes (bits <= 4): 8 codes -> 8 fp16/bf16 values in 4 registers.
//
// The fp16 value +-2^-o (o <= 3) has a zero low byte, so a code decodes to one byte: its high
// byte. PRMT looks up 4 bytes at once in an 8-byte table indexed by 3 selector bits, and the 4th
// selector bit asks for the sign of the selected byte replicated instead. We feed it the code
// with its top ("non-zero") bit inverted: weights index the table by (s, o); code 0 selects
// "sign of table[0]", and table[0] (s = 0, o = 0) has a clear sign bit, so it yields 0x00.
// bf16 needs two bytes per value; two tables give a high and a low byte plane.
// Cost: about one integer instruction per weight, which keeps batch-1 GEMV memory bound.
// ---------------------------------------------------------------------------------------------

struct NibbleTables {
  uint32_t hi_lo, hi_hi;  // high-byte table: entries 0-3 and 4-7
  uint32_t lo_lo, lo_hi;  // low-byte table (bf16 only; all zero for fp16)
};

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Selector nibbles for 8 codes in one word: top code bit inverted and moved to bit 3, (s, o)
// in bits 2..0. For bits < 4 the unused high bits of each nibble are zero, so the shift cannot
// carry a bit into the neighbouring nibble.
__device__ __forceinline__ uint32_t nibble_selectors(uint32_t codes8, int bits) {
  const uint32_t top = 1u << (bits - 1);
  return (codes8 ^ (top * 0x11111111u)) << (4 - bits);
}

// fp16: out[m] holds elements 2m (low half) and 2m+1 (high half) of the 8 codes.
__device__ __forceinline__ void decode8_half(uint32_t sel, const NibbleTables& t, uint32_t out[4]) {
  const uint32_t h0 = prmt(t.hi_lo, t.hi_hi, sel);        // high bytes of elements 0..3
  const uint32_t h1 = prmt(t.hi_lo, t.hi_hi, sel >> 16);  // high bytes of elements 4..7
  // Interleave with zero low bytes: bytes (0, h.e0, 0, h.e1) and (0, h.e2, 0, h.e3).
  out[0] = prmt(h0, 0u, 0x1404);
  out[1] = prmt(h0, 0u, 0x3424);
  out[2] = prmt(h1, 0u, 0x1404);
  out[3] = prmt(h1, 0u, 0x3424);
}

// bf16: the same layout, low bytes from the second table.
__device__ __forceinline__ void decode8_bf16(uint32_t sel, const NibbleTables& t, uint32_t out[4]) {
  const uint32_t h0 = prmt(t.hi_lo, t.hi_hi, sel);
  const uint32_t h1 = prmt(t.hi_lo, t.hi_hi, sel >> 16);
  const uint32_t l0 = prmt(t.lo_lo, t.lo_hi, sel);
  const uint32_t l1 = prmt(t.lo_lo, t.lo_hi, sel >> 16);
  // Bytes (l.e0, h.e0, l.e1, h.e1) and (l.e2, h.e2, l.e3, h.e3).
  out[0] = prmt(l0, h0, 0x5140);
  out[1] = prmt(l0, h0, 0x7362);
  out[2] = prmt(l1, h1, 0x5140);
  out[3] = prmt(l1, h1, 0x7362);
}

// ---------------------------------------------------------------------------------------------
// Activation types: conversion to and from fp32, and 16-byte vector unpacking.
// ---------------------------------------------------------------------------------------------

template <typename T>
struct Act;

template <>
struct Act<float> {
  static constexpr int kPerVec = 4;  // elements per 16-byte vector
  __device__ static float to_float(float v) { return v; }
  __device__ static float from_float(float v) { return v; }
  __device__ static void unpack(const uint4& u, float* out) {
    out[0] = __uint_as_float(u.x);
    out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
  }
};

template <>
struct Act<__half> {
  static constexpr int kPerVec = 8;
  __device__ static float to_float(__half v) { return __half2float(v); }
  __device__ static __half from_float(float v) { return __float2half_rn(v); }
  __device__ static void unpack(const uint4& u, float* out) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __half2 h;
      memcpy(&h, &w[i], sizeof(h));
      const float2 f = __half22float2(h);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
};

template <>
struct Act<__nv_bfloat16> {
  static constexpr int kPerVec = 8;
  __device__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  // bf16 is the top half of an fp32: widening is a shift or a mask.
  __device__ static void unpack(const uint4& u, float* out) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(w[i] << 16);
      out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  }
};

// Packed codes are read exactly once: stream them past L1 so activations keep it.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// 16 code bytes of a row starting at byte `off`, zero past the row's end. `vec` promises that
// the row start is 16-byte aligned and row_bytes % 16 == 0, so a chunk is all in or all out.
__device__ __forceinline__ uint4 load_codes16(const uint8_t* row, int64_t off, int64_t row_bytes,
                                              bool vec) {
  if (vec) {
    return off < row_bytes ? load_stream16(row + off) : make_uint4(0, 0, 0, 0);
  }
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (off + i < row_bytes) w[i / 4] |= uint32_t(__ldg(row + off + i)) << (8 * (i % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// N activations x[k0 .. k0+N) as fp32, zero past K (padding codes are 0, but 0 * NaN is not).
// `vec` promises a 16-byte aligned row; k0 must be a multiple of N (N a multiple of kPerVec).
template <typename T, int N>
__device__ __forceinline__ void load_act(const T* __restrict__ row, int64_t k0, int64_t K, bool vec,
                                         float (&out)[N]) {
  constexpr int P = Act<T>::kPerVec;
  static_assert(N % P == 0, "N must be a whole number of 16-byte vectors");
  if (vec && k0 + N <= K) {
#pragma unroll
    for (int v = 0; v < N / P; ++v) {
      Act<T>::unpack(__ldg(reinterpret_cast<const uint4*>(row + k0) + v), out + v * P);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = k0 + i < K ? Act<T>::to_float(row[k0 + i]) : 0.0f;
  }
}

// 32 raw 16-bit activations x[k0 .. k0+32) as 16 words (element 2m in the low half of word m),
// zero past K: the B operand of a tensor-core MMA is fed without any conversion.
template <typename T>
__device__ __forceinline__ void load_raw32(const T* __restrict__ row, int64_t k0, int64_t K,
                                           bool vec, uint32_t (&out)[16]) {
  static_assert(sizeof(T) == 2, "16-bit activations only");
  if (vec && k0 + 32 <= K) {
    const uint4* p = reinterpret_cast<const uint4*>(row + k0);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      const uint4 u = __ldg(p + v);
      out[4 * v] = u.x;
      out[4 * v + 1] = u.y;
      out[4 * v + 2] = u.z;
      out[4 * v + 3] = u.w;
    }
  } else {
    const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      const int64_t k = k0 + 2 * m;
      const uint32_t lo = k < K ? r[k] : 0u;
      const uint32_t hi = k + 1 < K ? r[k + 1] : 0u;
      out[m] = lo | (hi << 16);
    }
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
  return v;
}

}  // namespace inq
