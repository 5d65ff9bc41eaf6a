// Tensor-core kernel on nibble codes (bits <= 4, fp16/bf16, sm_80+), shared by linear and conv.
//
// It computes Y[col, o] = 2^scale_exp * sum_k W[o, k] * X[col, k] for a weight given as packed
// nibble codes, [O, K] row-major. Where the columns X[col, :] come from and where results go is
// a policy (`Columns`): rows of a matrix for linear (LinearColumns below), input patches
// gathered on the fly for an implicit-GEMM convolution (conv.cu). Only packed codes are read
// for the weight; they are decoded in registers (decode.cuh) straight into MMA fragments.
#pragma once

#include <type_traits>

#include "decode.cuh"

namespace inq {

constexpr int kMmaWarps = 8;     // warps of one block, splitting K between them
constexpr int kMmaKBlock = 128;  // k per warp iteration: 4 lanes x 32 nibbles

template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the host never launches this kernel below sm_80
#endif
}

template <typename T>
__device__ __forceinline__ void decode8(uint32_t codes8, int bits, const NibbleTables& t,
                                        uint32_t out[4]) {
  const uint32_t sel = nibble_selectors(codes8, bits);
  if constexpr (std::is_same_v<T, __half>) {
    decode8_half(sel, t, out);
  } else {
    decode8_bf16(sel, t, out);
  }
}

// Columns of a matrix X [B, K] with unit stride along K; results to Y [B, O] (row stride).
template <typename T>
struct LinearColumns {
  const T* x;
  int64_t x_stride;
  T* y;
  int64_t y_stride;
  int count;  // B
  int64_t K;
  bool vec;  // rows of x are 16-byte aligned

  struct Column {
    const T* row;  // null past the last column
  };
  __device__ Column column(int col) const {
    return Column{col < count ? x + int64_t(col) * x_stride : nullptr};
  }
  __device__ void load32(const Column& c, int64_t k0, uint32_t (&out)[16]) const {
    if (c.row != nullptr) {
      load_raw32(c.row, k0, K, vec, out);
    } else {
#pragma unroll
      for (int m = 0; m < 16; ++m) out[m] = 0;
    }
  }
  __device__ void store(int col, int o, T v) const { y[int64_t(col) * y_stride + o] = v; }
};

// Block: 16 output rows x (8 * NT) columns; its kMmaWarps warps take interleaved 128-wide k
// blocks and reduce through shared memory at the end.
//
// K permutation. The MMA fragment gives lane (g = lane / 4, t = lane % 4) the k slots
// {2t, 2t+1, 2t+8, 2t+9} of each 16-wide step. A dot product does not care in which order k is
// summed, as long as A and B agree, so within a 128-wide block lane t owns the 32 consecutive
// k = 32t .. 32t+31 (one 16-byte load of nibbles per row), and in step j (0..7) its slots
// {2t, 2t+1} hold k = 32t + 4j + {0, 1} and {2t+8, 2t+9} hold k = 32t + 4j + {2, 3}. The B
// fragment of the same lane then needs X[col g][32t + 4j .. 32t + 4j + 3]: 32 consecutive
// activations per lane per block, which for linear are plain 16-byte loads. No shared memory
// and no shuffles in the main loop.
template <typename T, int NT, typename Columns>
__global__ void __launch_bounds__(kMmaWarps * 32)
    nibble_mma_kernel(Columns cols, const uint8_t* __restrict__ packed, int64_t row_bytes,
                      int bits, NibbleTables tables, int scale_exp, const T* __restrict__ bias,
                      int O, bool vec_codes) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  const int row0 = blockIdx.x * 16;
  const int col0 = blockIdx.y * 8 * NT;

  // Rows g and g + 8 of the tile; a row past O reads no codes (its result is not stored).
  const bool has_r0 = row0 + g < O;
  const bool has_r1 = row0 + g + 8 < O;
  const uint8_t* r0 = packed + int64_t(row0 + g) * row_bytes;
  const uint8_t* r1 = packed + int64_t(row0 + g + 8) * row_bytes;

  typename Columns::Column column[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) column[nt] = cols.column(col0 + nt * 8 + g);

  float acc[NT][4] = {};
  const int64_t kblocks = (cols.K + kMmaKBlock - 1) / kMmaKBlock;
  for (int64_t kb = warp; kb < kblocks; kb += kMmaWarps) {
    const int64_t off = kb * (kMmaKBlock / 2) + 16 * t;  // this lane's 16 code bytes
    const uint4 q0 = has_r0 ? load_codes16(r0, off, row_bytes, vec_codes) : make_uint4(0, 0, 0, 0);
    const uint4 q1 = has_r1 ? load_codes16(r1, off, row_bytes, vec_codes) : make_uint4(0, 0, 0, 0);
    const int64_t k0 = kb * kMmaKBlock + 32 * t;

    uint32_t xb[NT][16];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) cols.load32(column[nt], k0, xb[nt]);

    const uint32_t w0[4] = {q0.x, q0.y, q0.z, q0.w};
    const uint32_t w1[4] = {q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {  // 8 codes per word = two MMA steps
      uint32_t a0[4], a1[4];       // a0[m]: row g, elements 8w + 2m, +1; a1: row g + 8
      decode8<T>(w0[w], bits, tables, a0);
      decode8<T>(w1[w], bits, tables, a1);
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // step j = 2w + h: elements 8w + 4h .. 8w + 4h + 3
        const uint32_t a[4] = {a0[2 * h], a1[2 * h], a0[2 * h + 1], a1[2 * h + 1]};
        const int j = 2 * w + h;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma16816<T>(acc[nt], a, xb[nt][2 * j], xb[nt][2 * j + 1]);
      }
    }
  }

  // Split-K reduction: every warp parks its accumulators, warp 0 adds them up and writes.
  __shared__ float partial[kMmaWarps][NT * 4][32];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[warp][nt * 4 + e][lane] = acc[nt][e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) sum += partial[w][nt * 4 + e][lane];
      // Accumulator layout of m16n8: c0, c1 at (row g, cols 2t, 2t+1); c2, c3 at row g + 8.
      const int o = row0 + g + (e >= 2 ? 8 : 0);
      const int col = col0 + nt * 8 + 2 * t + (e & 1);
      if (o < O && col < cols.count) {
        float v = scalbnf(sum, scale_exp);
        if (bias != nullptr) v += Act<T>::to_float(bias[o]);
        cols.store(col, o, Act<T>::from_float(v));
      }
    }
  }
}

// The byte tables of decode.cuh for `bits` (<= 4), and the matching scale exponent offset.
// fp16 decodes (-1)^s 2^-o (scale 2^n1); bf16 decodes (-1)^s 2^(1-o) (scale 2^(n1-1)) so that
// table entry 0 has an all-zero low byte, which code 0 relies on (see decode.cuh).
inline NibbleTables nibble_tables(int bits, bool bf16) {
  uint8_t hi[8] = {}, lo[8] = {};
  const int offsets = 1 << (bits - 2);
  for (int s = 0; s < 2; ++s) {
    for (int o = 0; o < offsets; ++o) {
      const int index = ((s << (bits - 2)) | o) << (4 - bits);
      if (bf16) {
        const int e = 128 - o;  // bf16: sign, 8 exponent bits, 7 mantissa bits
        hi[index] = uint8_t((s << 7) | (e >> 1));
        lo[index] = uint8_t((e & 1) << 7);
      } else {
        hi[index] = uint8_t((s << 7) | ((15 - o) << 2));  // fp16: sign, 5 exponent bits, 10
      }
    }
  }
  auto word = [](const uint8_t* b) {
    return uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  };
  return NibbleTables{word(hi), word(hi + 4), word(lo), word(lo + 4)};
}

template <typename T>
constexpr int nibble_scale_offset() {
  return std::is_same_v<T, __nv_bfloat16> ? -1 : 0;
}

// Launch on a CUDA stream: grid x over 16-row tiles of O, y over column tiles.
template <typename T, int NT, typename Columns>
void launch_nibble_mma(const Columns& cols, const uint8_t* packed, int64_t row_bytes, int bits,
                       int n1, const T* bias, int O, cudaStream_t stream) {
  const dim3 grid((O + 15) / 16, (cols.count + 8 * NT - 1) / (8 * NT));
  const bool vec_codes = reinterpret_cast<uintptr_t>(packed) % 16 == 0 && row_bytes % 16 == 0;
  nibble_mma_kernel<T, NT, Columns><<<grid, kMmaWarps * 32, 0, stream>>>(
      cols, packed, row_bytes, bits, nibble_tables(bits, std::is_same_v<T, __nv_bfloat16>),
      n1 + nibble_scale_offset<T>(), bias, O, vec_codes);
}

}  // namespace inq
