// inq::shift_linear_int8: int8 activations, power-of-two weights, int32 shift-and-add.
//
// The arithmetic of multiplier-free fixed-point hardware, bit-exact against the integer
// reference in inq/kernels/int8.py:
//
//   y[b, o] = sum_k  ((s_k ? -x[b, k] : x[b, k]) * 2^frac) >> o_k      (code 0 adds 0)
//
// with `>>` an arithmetic shift (floor division by 2^o_k). The term is exact whenever
// frac >= o_k; y * 2^(n1 - frac) then approximates x . W. The caller guarantees
// K * 2^(7 + frac) < 2^31, so neither a term nor any partial sum can overflow int32, and integer
// addition is associative: any summation order (lanes, warp shuffles) gives the same bits.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <cstdint>

namespace inq {
namespace {

constexpr int kInt8Warps = 4;  // output rows per block, one warp each

__global__ void __launch_bounds__(kInt8Warps * 32)
    shift_linear_int8_kernel(const int8_t* __restrict__ x, int64_t x_stride,
                             const uint8_t* __restrict__ packed, int64_t row_bytes, int code_width,
                             int bits, int frac, int32_t* __restrict__ y, int B, int O, int64_t K) {
  const int lane = threadIdx.x % 32;
  const int o = blockIdx.x * kInt8Warps + threadIdx.x / 32;
  const int b = blockIdx.y;
  if (o >= O) return;
  const uint8_t* row = packed + int64_t(o) * row_bytes;
  const int8_t* xb = x + int64_t(b) * x_stride;
  const uint32_t nz_shift = bits - 1, s_shift = bits - 2, o_mask = (1u << (bits - 2)) - 1u;

  int32_t acc = 0;
  for (int64_t k = lane; k < K; k += 32) {
    uint32_t code = row[k * code_width / 8];
    if (code_width == 4) code = (k & 1) ? code >> 4 : code & 0xFu;
    const int32_t v = int32_t(xb[k]) * (1 << frac);          // |v| <= 2^(7 + frac) < 2^31
    const int32_t signed_v = ((code >> s_shift) & 1u) ? -v : v;
    const int shift = min(int(code & o_mask), 31);          // >> 31 already gives 0 or -1
    acc += ((code >> nz_shift) != 0u) ? (signed_v >> shift) : 0;
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, d);
  if (lane == 0) y[int64_t(b) * O + o] = acc;
}

}  // namespace

at::Tensor shift_linear_int8(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                             int64_t in_features, int64_t frac_bits) {
  TORCH_CHECK(bits >= 2 && bits <= 8, "inq: bits must be in [2, 8], got ", bits);
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kChar && x.dim() == 2 &&
                  x.size(1) == in_features && x.stride(1) == 1,
              "inq: x must be a CUDA int8 [B, in_features] tensor with contiguous rows");
  const int cw = bits <= 4 ? 4 : 8;
  TORCH_CHECK(packed.is_cuda() && packed.scalar_type() == at::kByte && packed.dim() == 2 &&
                  packed.is_contiguous() && packed.size(1) == (in_features * cw + 7) / 8,
              "inq: packed must be a contiguous uint8 [O, row_bytes] CUDA tensor");
  TORCH_CHECK(frac_bits >= 0 && frac_bits <= 23 &&
                  (in_features << (7 + frac_bits)) < (int64_t(1) << 31),
              "inq: frac_bits=", frac_bits, " can overflow int32 for K=", in_features);
  const c10::cuda::CUDAGuard guard(x.device());
  const int B = x.size(0), O = packed.size(0);
  at::Tensor y = at::empty({B, O}, x.options().dtype(at::kInt));
  if (y.numel() == 0) return y;
  const dim3 grid((O + kInt8Warps - 1) / kInt8Warps, B);
  shift_linear_int8_kernel<<<grid, kInt8Warps * 32, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<int8_t>(), x.stride(0), packed.data_ptr<uint8_t>(), packed.size(1), cw, int(bits),
      int(frac_bits), y.data_ptr<int32_t>(), B, O, in_features);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace inq
