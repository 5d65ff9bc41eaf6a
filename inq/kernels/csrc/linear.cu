// inq::shift_linear on CUDA: y[b, o] = 2^n1 * sum_k x[b, k] * (-1)^s * 2^(-o_k) + bias[o].
//
// Three kernels, chosen by the host code below and by inq/kernels/cuda.py:
//  * nibble_mma_kernel (mma.cuh): bits <= 4, fp16/bf16, batch <= 32. Reads only the packed
//    nibbles, decodes them in registers with byte permutes (decode.cuh) straight into
//    tensor-core MMA fragments; fp32 accumulation. Serves batch 1 as well: the MMA costs less
//    issue bandwidth than converting and FMA-ing every weight on the CUDA cores.
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
#include "mma.cuh"

namespace inq {
namespace {

constexpr int kFmaWarps = 4;  // rows per block of the FMA kernel (one warp each)

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
                const T* bias, at::Tensor& y, bool vec_x) {
  const LinearColumns<T> cols{reinterpret_cast<const T*>(x.data_ptr()), x.stride(0),
                              reinterpret_cast<T*>(y.data_ptr()), y.stride(0), int(x.size(0)),
                              x.size(1), vec_x};
  launch_nibble_mma<T, NT>(cols, packed.data_ptr<uint8_t>(), packed.size(1), int(bits), int(n1),
                           bias, int(packed.size(0)), c10::cuda::getCurrentCUDAStream());
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
      if (B <= 8) return launch_mma<T, 1>(x, packed, bits, n1, b, y, vec_x);
      if (B <= 16) return launch_mma<T, 2>(x, packed, bits, n1, b, y, vec_x);
      return launch_mma<T, 4>(x, packed, bits, n1, b, y, vec_x);
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
