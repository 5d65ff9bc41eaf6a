// Depthwise inq::shift_conv2d (groups == in_channels, one input channel per group).
//
// A depthwise filter has only kh * kw taps per output channel: there is no reduction long
// enough for tensor cores, and cuDNN's fp16 depthwise kernels are not its strongest. One thread
// computes one output element directly from the packed codes (a few bytes per channel, served
// from L1) and the input, read through its strides so NCHW, channels_last and other views need
// no copy. fp32 accumulation, 2^n1 applied once. Other convolutions decode their (small) weight
// once and call cuDNN, see inq/kernels/cuda.py.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "decode.cuh"

namespace inq {
namespace {

struct ConvGeometry {
  int N, C, H, W;             // input
  int O, OH, OW;              // output channels and size
  int kh, kw, sh, sw, ph, pw, dh, dw;
  int mult;                   // output channels per input channel (O = C * mult)
  int64_t xs[4], ys[4];       // element strides of x and y (n, c, h, w)
};

template <typename T>
__global__ void depthwise_conv2d_kernel(const T* __restrict__ x, const uint8_t* __restrict__ packed,
                                        int64_t row_bytes, int code_width, int bits, int n1,
                                        const T* __restrict__ bias, T* __restrict__ y,
                                        ConvGeometry g) {
  const int64_t total = int64_t(g.N) * g.O * g.OH * g.OW;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    // Consecutive threads take consecutive output columns: coalesced for NCHW.
    const int ow = int(i % g.OW);
    const int oh = int((i / g.OW) % g.OH);
    const int o = int((i / (int64_t(g.OW) * g.OH)) % g.O);
    const int n = int(i / (int64_t(g.OW) * g.OH * g.O));
    const T* xc = x + n * g.xs[0] + (o / g.mult) * g.xs[1];
    const uint8_t* codes = packed + int64_t(o) * row_bytes;
    float acc = 0.0f;
    for (int r = 0; r < g.kh; ++r) {
      const int ih = oh * g.sh - g.ph + r * g.dh;
      if (ih < 0 || ih >= g.H) continue;
      for (int s = 0; s < g.kw; ++s) {
        const int iw = ow * g.sw - g.pw + s * g.dw;
        if (iw < 0 || iw >= g.W) continue;
        const int k = r * g.kw + s;
        uint32_t code = __ldg(codes + k * code_width / 8);
        if (code_width == 4) code = (k & 1) ? code >> 4 : code & 0xFu;
        acc = fmaf(decode_relative_f32(code, bits),
                   Act<T>::to_float(xc[ih * g.xs[2] + iw * g.xs[3]]), acc);
      }
    }
    float v = scalbnf(acc, n1);
    if (bias != nullptr) v += Act<T>::to_float(bias[o]);
    y[n * g.ys[0] + o * g.ys[1] + oh * g.ys[2] + ow * g.ys[3]] = Act<T>::from_float(v);
  }
}

template <typename T>
void launch_depthwise(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                      const std::optional<at::Tensor>& bias, at::Tensor& y,
                      const ConvGeometry& g) {
  const int64_t total = y.numel();
  const int threads = 256;
  const int blocks = int(std::min<int64_t>((total + threads - 1) / threads, 65535 * 4));
  depthwise_conv2d_kernel<T><<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const T*>(x.data_ptr()), packed.data_ptr<uint8_t>(), packed.size(1),
      bits <= 4 ? 4 : 8, int(bits), int(n1),
      bias ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr,
      reinterpret_cast<T*>(y.data_ptr()), g);
}

}  // namespace

// x: [N, C, H, W] (any strides); packed: [O, ceil(kh*kw*w/8)] with O = C * mult.
// Returns y: [N, O, OH, OW], contiguous like the reference op's result.
at::Tensor depthwise_conv2d(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                            int64_t n1, at::IntArrayRef weight_shape,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 4, "inq: depthwise_conv2d needs a CUDA [N, C, H, W] x");
  TORCH_CHECK(weight_shape.size() == 4 && weight_shape[1] == 1,
              "inq: depthwise_conv2d needs a weight [O, 1, kh, kw]");
  TORCH_CHECK(packed.is_cuda() && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.dim() == 2 && packed.size(0) == weight_shape[0],
              "inq: packed must be a contiguous uint8 [O, row_bytes] CUDA tensor");
  const int64_t taps = weight_shape[2] * weight_shape[3];
  TORCH_CHECK(packed.size(1) == (taps * (bits <= 4 ? 4 : 8) + 7) / 8,
              "inq: packed row length does not match the weight shape");
  TORCH_CHECK(weight_shape[0] % x.size(1) == 0, "inq: out_channels must be a multiple of C");
  if (bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == weight_shape[0] &&
                    bias->scalar_type() == x.scalar_type(),
                "inq: bias must be a contiguous [O] tensor of x's dtype");
  }
  ConvGeometry g{};
  g.N = int(x.size(0));
  g.C = int(x.size(1));
  g.H = int(x.size(2));
  g.W = int(x.size(3));
  g.O = int(weight_shape[0]);
  g.kh = int(weight_shape[2]);
  g.kw = int(weight_shape[3]);
  g.sh = int(stride[0]);
  g.sw = int(stride[1]);
  g.ph = int(padding[0]);
  g.pw = int(padding[1]);
  g.dh = int(dilation[0]);
  g.dw = int(dilation[1]);
  g.OH = (g.H + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.OW = (g.W + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  g.mult = g.O / g.C;
  TORCH_CHECK(g.OH > 0 && g.OW > 0, "inq: the convolution output would be empty");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({g.N, g.O, g.OH, g.OW}, x.options());
  for (int d = 0; d < 4; ++d) {
    g.xs[d] = x.stride(d);
    g.ys[d] = y.stride(d);
  }
  if (y.numel() == 0) return y;
  switch (x.scalar_type()) {
    case at::kFloat: launch_depthwise<float>(x, packed, bits, n1, bias, y, g); break;
    case at::kHalf: launch_depthwise<__half>(x, packed, bits, n1, bias, y, g); break;
    case at::kBFloat16: launch_depthwise<__nv_bfloat16>(x, packed, bits, n1, bias, y, g); break;
    default: TORCH_CHECK(false, "inq: activations must be float32, float16 or bfloat16");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

}  // namespace inq
