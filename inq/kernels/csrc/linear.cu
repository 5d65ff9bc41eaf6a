// inq::shift_linear on CUDA: y[b, o] = 2^n1 * sum_k x[b, k] * (-1)^s * 2^(-o_k) + bias[o].
//
// Three kernels, chosen by the host code below and by inq/kernels/cuda.py:
//  * nibble_mma_kernel: bits <= 4, fp16/bf16, batch <= 32. Reads only the packed nibbles,
//    decodes them in registers with byte permutes (decode.cuh) straight into tensor-core MMA
//    fragments; fp32 accumulation. Serves batch 1 as well: the MMA costs less issue bandwidth
//    than converting and FMA-ing every weight on the CUDA cores.
//  * fma_gemv_kernel: every other small-batch case (byte codes, fp32, pre-sm_80 GPUs). One warp
//    per output row, 16-byte code loads, fp32 decode by bit placement, fp32 FMA.
//  * decode_weight_kernel: writes the dense weight in the activation dtype; the large-batch path
//    (cuda.py) hands it to cuBLAS. Compute-bound batches amortise this one decode.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cmath>

#include "decode.cuh"

namespace inq {
namespace {

constexpr int kMmaWarps = 8;   // warps of one block, splitting K between them
constexpr int kFmaWarps = 4;   // rows per block of the FMA kernel (one warp each)
constexpr int kMmaKBlock = 128;  // k per warp iteration: 4 lanes x 32 nibbles

// ---------------------------------------------------------------------------------------------
// Tensor-core path (sm_80+): mma.sync m16n8k16, A = 16 weight rows, B = 8 batch columns.
// ---------------------------------------------------------------------------------------------

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

// Block: 16 output rows x (8 * NT) batch columns; its kMmaWarps warps take interleaved 128-wide
// k blocks and reduce through shared memory at the end.
//
// K permutation. The MMA fragment gives lane (g = lane / 4, t = lane % 4) the k slots
// {2t, 2t+1, 2t+8, 2t+9} of each 16-wide step. A dot product does not care in which order k is
// summed, as long as A and B agree, so within a 128-wide block lane t owns the 32 consecutive
// k = 32t .. 32t+31 (one 16-byte load of nibbles per row), and in step j (0..7) its slots
// {2t, 2t+1} hold k = 32t + 4j + {0, 1} and {2t+8, 2t+9} hold k = 32t + 4j + {2, 3}. The B
// fragment of the same lane then needs x[col g][32t + 4j .. 32t + 4j + 3]: 32 consecutive
// activations per lane per block, again plain 16-byte loads. No shared memory, no shuffles.
template <typename T, int NT>
__global__ void __launch_bounds__(kMmaWarps * 32)
    nibble_mma_kernel(const T* __restrict__ x, int64_t x_stride, const uint8_t* __restrict__ packed,
                      int64_t row_bytes, int bits, NibbleTables tables, int scale_exp,
                      const T* __restrict__ bias, T* __restrict__ y, int64_t y_stride, int B,
                      int O, int64_t K, bool vec_codes, bool vec_x) {
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

  float acc[NT][4] = {};
  const int64_t kblocks = (K + kMmaKBlock - 1) / kMmaKBlock;
  for (int64_t kb = warp; kb < kblocks; kb += kMmaWarps) {
    const int64_t off = kb * (kMmaKBlock / 2) + 16 * t;  // this lane's 16 code bytes
    const uint4 q0 = has_r0 ? load_codes16(r0, off, row_bytes, vec_codes) : make_uint4(0, 0, 0, 0);
    const uint4 q1 = has_r1 ? load_codes16(r1, off, row_bytes, vec_codes) : make_uint4(0, 0, 0, 0);
    const int64_t k0 = kb * kMmaKBlock + 32 * t;

    uint32_t xb[NT][16];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int col = col0 + nt * 8 + g;
      if (col < B) {
        load_raw32(x + int64_t(col) * x_stride, k0, K, vec_x, xb[nt]);
      } else {
#pragma unroll
        for (int m = 0; m < 16; ++m) xb[nt][m] = 0;
      }
    }

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
      const int b = col0 + nt * 8 + 2 * t + (e & 1);
      if (o < O && b < B) {
        float v = scalbnf(sum, scale_exp);
        if (bias != nullptr) v += Act<T>::to_float(bias[o]);
        y[int64_t(b) * y_stride + o] = Act<T>::from_float(v);
      }
    }
  }
}

// The byte tables of decode.cuh for `bits` (<= 4). fp16 decodes (-1)^s 2^-o (scale 2^n1);
// bf16 decodes (-1)^s 2^(1-o) (scale 2^(n1-1)) so that table entry 0 has an all-zero low byte,
// which code 0 relies on (see decode.cuh).
NibbleTables nibble_tables(int bits, bool bf16) {
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

// ---------------------------------------------------------------------------------------------
// CUDA-core path: one warp per output row, BT batch rows per launch column.
// ---------------------------------------------------------------------------------------------

template <typename T, int CW, int BT>
__global__ void __launch_bounds__(kFmaWarps * 32)
    fma_gemv_kernel(const T* __restrict__ x, int64_t x_stride, const uint8_t* __restrict__ packed,
                    int64_t row_bytes, int bits, int n1, const T* __restrict__ bias,
                    T* __restrict__ y, int64_t y_stride, int B, int O, int64_t K, bool vec_codes,
                    bool vec_x) {
  constexpr int E = 128 / CW;  // codes per 16-byte chunk: 32 nibbles or 16 bytes
  const int lane = threadIdx.x % 32;
  const int o = blockIdx.x * kFmaWarps + threadIdx.x / 32;
  const int b0 = blockIdx.y * BT;
  if (o >= O) return;  // whole warp leaves together: no block-level synchronisation below
  const uint8_t* row = packed + int64_t(o) * row_bytes;

  float acc[BT] = {};
  for (int64_t chunk = lane; chunk * 16 < row_bytes; chunk += 32) {
    const uint4 q = load_codes16(row, chunk * 16, row_bytes, vec_codes);
    const uint32_t words[4] = {q.x, q.y, q.z, q.w};
    float w[E];
#pragma unroll
    for (int i = 0; i < E; ++i) {
      const uint32_t code = (words[i / (E / 4)] >> (CW * (i % (E / 4)))) & ((1u << CW) - 1u);
      w[i] = decode_relative_f32(code, bits);
    }
    const int64_t k0 = chunk * E;
#pragma unroll
    for (int b = 0; b < BT; ++b) {
      if (b0 + b >= B) break;
      float xv[E];
      load_act<T, E>(x + int64_t(b0 + b) * x_stride, k0, K, vec_x, xv);
#pragma unroll
      for (int i = 0; i < E; ++i) acc[b] = fmaf(w[i], xv[i], acc[b]);
    }
  }
#pragma unroll
  for (int b = 0; b < BT; ++b) {
    const float sum = warp_sum(acc[b]);
    if (lane == 0 && b0 + b < B) {
      float v = scalbnf(sum, n1);
      if (bias != nullptr) v += Act<T>::to_float(bias[o]);
      y[int64_t(b0 + b) * y_stride + o] = Act<T>::from_float(v);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dense decode for the large-batch path: w[o, k] = (-1)^s 2^(n1 - o), rounded once to T exactly
// as the reference (inq.pow2.decode_unchecked then .to(dtype)) does.
// ---------------------------------------------------------------------------------------------

template <typename T>
__global__ void decode_weight_kernel(const uint8_t* __restrict__ packed, int64_t row_bytes,
                                     int code_width, int bits, int n1, T* __restrict__ w, int O,
                                     int64_t K) {
  const int64_t total = int64_t(O) * K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = i / K, k = i % K;
    uint32_t code = packed[o * row_bytes + k * code_width / 8];
    if (code_width == 4) code = (k & 1) ? code >> 4 : code & 0xFu;
    w[i] = Act<T>::from_float(scalbnf(decode_relative_f32(code, bits), n1));
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.
// ---------------------------------------------------------------------------------------------

int code_width(int64_t bits) { return bits <= 4 ? 4 : 8; }

void check_packed(const at::Tensor& packed, int64_t bits, int64_t K) {
  TORCH_CHECK(bits >= 2 && bits <= 8, "inq: bits must be in [2, 8], got ", bits);
  TORCH_CHECK(packed.is_cuda() && packed.scalar_type() == at::kByte && packed.dim() == 2,
              "inq: packed must be a uint8 [O, row_bytes] CUDA tensor");
  TORCH_CHECK(packed.size(1) == (K * code_width(bits) + 7) / 8, "inq: packed has ",
              packed.size(1), " bytes per row, ", K, " ", bits, "-bit codes need ",
              (K * code_width(bits) + 7) / 8);
  TORCH_CHECK(packed.is_contiguous(), "inq: packed must be contiguous");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// (ATen's device-properties helper pulls in cuBLAS and cuSPARSE headers; ask the runtime.)
int compute_capability_major(int device) {
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

template <typename T, int NT>
void launch_mma(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                const T* bias, at::Tensor& y, bool vec_codes, bool vec_x) {
  const int B = x.size(0), O = packed.size(0);
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const dim3 grid((O + 15) / 16, (B + 8 * NT - 1) / (8 * NT));
  nibble_mma_kernel<T, NT><<<grid, kMmaWarps * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const T*>(x.data_ptr()), x.stride(0), packed.data_ptr<uint8_t>(),
      packed.stride(0), int(bits), nibble_tables(int(bits), bf16), int(n1 - (bf16 ? 1 : 0)), bias,
      reinterpret_cast<T*>(y.data_ptr()), y.stride(0), B, O, x.size(1), vec_codes, vec_x);
}

template <typename T, int CW, int BT>
void launch_fma(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                const T* bias, at::Tensor& y, bool vec_codes, bool vec_x) {
  const int B = x.size(0), O = packed.size(0);
  const dim3 grid((O + kFmaWarps - 1) / kFmaWarps, (B + BT - 1) / BT);
  fma_gemv_kernel<T, CW, BT><<<grid, kFmaWarps * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const T*>(x.data_ptr()), x.stride(0), packed.data_ptr<uint8_t>(),
      packed.stride(0), int(bits), int(n1), bias, reinterpret_cast<T*>(y.data_ptr()), y.stride(0),
      B, O, x.size(1), vec_codes, vec_x);
}

template <typename T>
void dispatch_linear(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                     const std::optional<at::Tensor>& bias, at::Tensor& y) {
  const T* b = bias ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr;
  const bool vec_codes = aligned16(packed.data_ptr()) && packed.size(1) % 16 == 0;
  const bool vec_x = aligned16(x.data_ptr()) && (x.stride(0) * int64_t(sizeof(T))) % 16 == 0;
  const int B = x.size(0);
  if constexpr (!std::is_same_v<T, float>) {
    if (bits <= 4 && compute_capability_major(x.get_device()) >= 8) {
      if (B <= 8) return launch_mma<T, 1>(x, packed, bits, n1, b, y, vec_codes, vec_x);
      if (B <= 16) return launch_mma<T, 2>(x, packed, bits, n1, b, y, vec_codes, vec_x);
      return launch_mma<T, 4>(x, packed, bits, n1, b, y, vec_codes, vec_x);
    }
  }
  // Batch tile: each decoded weight is reused across BT activation rows held in registers.
  if (bits <= 4) {
    if (B == 1) return launch_fma<T, 4, 1>(x, packed, bits, n1, b, y, vec_codes, vec_x);
    if (B <= 4) return launch_fma<T, 4, 4>(x, packed, bits, n1, b, y, vec_codes, vec_x);
    return launch_fma<T, 4, 8>(x, packed, bits, n1, b, y, vec_codes, vec_x);
  }
  if (B == 1) return launch_fma<T, 8, 1>(x, packed, bits, n1, b, y, vec_codes, vec_x);
  if (B <= 4) return launch_fma<T, 8, 4>(x, packed, bits, n1, b, y, vec_codes, vec_x);
  return launch_fma<T, 8, 8>(x, packed, bits, n1, b, y, vec_codes, vec_x);
}

}  // namespace

// x: [B, K] with unit stride along K (any row stride). Returns y: [B, O] in x's dtype.
at::Tensor shift_linear_small_batch(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                                    int64_t n1, int64_t in_features,
                                    const std::optional<at::Tensor>& bias) {
  check_packed(packed, bits, in_features);
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.size(1) == in_features && x.stride(1) == 1,
              "inq: x must be a CUDA [B, in_features] tensor with contiguous rows");
  TORCH_CHECK(x.device() == packed.device(), "inq: x and packed are on different devices");
  if (bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == packed.size(0) &&
                    bias->scalar_type() == x.scalar_type() && bias->device() == x.device(),
                "inq: bias must be a contiguous [O] tensor of x's dtype and device");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({x.size(0), packed.size(0)}, x.options());
  if (x.size(0) == 0 || packed.size(0) == 0) return y;
  switch (x.scalar_type()) {
    case at::kFloat: dispatch_linear<float>(x, packed, bits, n1, bias, y); break;
    case at::kHalf: dispatch_linear<__half>(x, packed, bits, n1, bias, y); break;
    case at::kBFloat16: dispatch_linear<__nv_bfloat16>(x, packed, bits, n1, bias, y); break;
    default: TORCH_CHECK(false, "inq: activations must be float32, float16 or bfloat16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

// The dense weight [O, in_features] in `dtype`, for cuBLAS / cuDNN on large batches.
at::Tensor decode_weight(const at::Tensor& packed, int64_t bits, int64_t n1, int64_t in_features,
                         at::ScalarType dtype) {
  check_packed(packed, bits, in_features);
  const c10::cuda::CUDAGuard guard(packed.device());
  const int O = packed.size(0);
  at::Tensor w = at::empty({O, in_features}, packed.options().dtype(dtype));
  if (w.numel() == 0) return w;
  const int threads = 256;
  const int blocks = int(std::min<int64_t>((w.numel() + threads - 1) / threads, 65535));
  const auto stream = c10::cuda::getCurrentCUDAStream();
  const auto* src = packed.data_ptr<uint8_t>();
  const int cw = code_width(bits);
  switch (dtype) {
    case at::kFloat:
      decode_weight_kernel<float><<<blocks, threads, 0, stream>>>(
          src, packed.stride(0), cw, bits, n1, w.data_ptr<float>(), O, in_features);
      break;
    case at::kHalf:
      decode_weight_kernel<__half><<<blocks, threads, 0, stream>>>(
          src, packed.stride(0), cw, bits, n1, reinterpret_cast<__half*>(w.data_ptr()), O,
          in_features);
      break;
    case at::kBFloat16:
      decode_weight_kernel<__nv_bfloat16><<<blocks, threads, 0, stream>>>(
          src, packed.stride(0), cw, bits, n1, reinterpret_cast<__nv_bfloat16*>(w.data_ptr()), O,
          in_features);
      break;
    default: TORCH_CHECK(false, "inq: decode_weight supports float32, float16 and bfloat16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return w;
}

}  // namespace inq
