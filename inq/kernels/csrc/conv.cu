// inq::shift_conv2d on packed codes, two kernels (inq/kernels/cuda.py picks; the rest decodes
// the weight once and calls cuDNN):
//
//  * depthwise (groups == in_channels): a depthwise filter has only kh * kw taps per output
//    channel, no reduction long enough for tensor cores. One thread computes one output element
//    directly from the packed codes (a few bytes per channel, served from L1) and the input.
//  * implicit GEMM (groups == 1, nibble codes, fp16/bf16): the tensor-core kernel of linear
//    (mma.cuh) with its columns gathered on the fly from the input: column = output pixel,
//    k = (channel, r, s) in the weight's own [O, C, kh, kw] order. No im2col buffer.
//
// Both read the input through its strides (NCHW, channels_last, any view: no copy), accumulate
// in fp32, apply 2^n1 once, and write a contiguous NCHW output like the reference op.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "decode.cuh"
#include "mma.cuh"

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

// Implicit-GEMM columns: column = output pixel (n, oh, ow), k = (c, r, s).
template <typename T>
struct ConvColumns {
  const T* x;
  T* y;
  int count;  // N * OH * OW
  int64_t K;  // C * kh * kw
  ConvGeometry g;

  struct Column {
    const uint16_t* image;  // x[n] as raw 16-bit values; null past the last pixel
    int ih0, iw0;           // input position of tap (0, 0)
  };
  __device__ Column column(int col) const {
    if (col >= count) return Column{nullptr, 0, 0};
    const int ow = col % g.OW, oh = (col / g.OW) % g.OH, n = col / (g.OW * g.OH);
    return Column{reinterpret_cast<const uint16_t*>(x + n * g.xs[0]), oh * g.sh - g.ph,
                  ow * g.sw - g.pw};
  }
  // 32 consecutive k from k0: (c, r, s) is divided out once, then stepped like an odometer.
  __device__ void load32(const Column& col, int64_t k0, uint32_t (&out)[16]) const {
    const int taps = g.kh * g.kw;
    int c = int(k0 / taps);
    int r = int(k0 - int64_t(c) * taps) / g.kw;
    int s = int(k0 - int64_t(c) * taps) - r * g.kw;
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      uint32_t pair = 0;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ih = col.ih0 + r * g.dh, iw = col.iw0 + s * g.dw;
        if (col.image != nullptr && k0 + 2 * m + e < K && ih >= 0 && ih < g.H && iw >= 0 &&
            iw < g.W) {
          pair |= uint32_t(__ldg(col.image + c * g.xs[1] + ih * g.xs[2] + iw * g.xs[3]))
                  << (16 * e);
        }
        if (++s == g.kw) {
          s = 0;
          if (++r == g.kh) {
            r = 0;
            ++c;
          }
        }
      }
      out[m] = pair;
    }
  }
  __device__ void store(int col, int o, T v) const {
    const int pixels = g.OH * g.OW;
    y[(int64_t(col / pixels) * g.O + o) * pixels + col % pixels] = v;
  }
};

ConvGeometry geometry(const at::Tensor& x, at::IntArrayRef weight_shape, at::IntArrayRef stride,
                      at::IntArrayRef padding, at::IntArrayRef dilation) {
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
  for (int d = 0; d < 4; ++d) g.xs[d] = x.stride(d);
  return g;
}

void check_conv_args(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                     at::IntArrayRef weight_shape, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(bits >= 2 && bits <= 8, "inq: bits must be in [2, 8], got ", bits);
  TORCH_CHECK(x.is_cuda() && x.dim() == 4, "inq: conv2d kernels need a CUDA [N, C, H, W] x");
  TORCH_CHECK(weight_shape.size() == 4, "inq: weight_shape must be [O, C/groups, kh, kw]");
  const int64_t k = weight_shape[1] * weight_shape[2] * weight_shape[3];
  TORCH_CHECK(packed.is_cuda() && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.dim() == 2 && packed.size(0) == weight_shape[0] &&
                  packed.size(1) == (k * (bits <= 4 ? 4 : 8) + 7) / 8,
              "inq: packed must be a contiguous uint8 [O, row_bytes] CUDA tensor for the weight");
  TORCH_CHECK(x.device() == packed.device(), "inq: x and packed are on different devices");
  if (bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == weight_shape[0] &&
                    bias->scalar_type() == x.scalar_type() && bias->device() == x.device(),
                "inq: bias must be a contiguous [O] tensor of x's dtype and device");
  }
}

template <typename T, int NT>
void launch_implicit(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                     const std::optional<at::Tensor>& bias, at::Tensor& y,
                     const ConvGeometry& g) {
  const ConvColumns<T> cols{reinterpret_cast<const T*>(x.data_ptr()),
                            reinterpret_cast<T*>(y.data_ptr()), g.N * g.OH * g.OW,
                            int64_t(g.C) * g.kh * g.kw, g};
  launch_nibble_mma<T, NT>(cols, packed.data_ptr<uint8_t>(), packed.size(1), int(bits), int(n1),
                           bias ? reinterpret_cast<const T*>(bias->data_ptr()) : nullptr, g.O,
                           c10::cuda::getCurrentCUDAStream());
}

template <typename T>
void dispatch_implicit(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                       const std::optional<at::Tensor>& bias, at::Tensor& y,
                       const ConvGeometry& g) {
  // Fewer columns per block for few pixels: more blocks to fill the GPU (late layers at batch
  // 1 have 49 pixels). NT = 4 needs ~185 registers a thread here (one block per SM).
  const int64_t pixels = int64_t(g.N) * g.OH * g.OW;
  if (pixels <= 8) return launch_implicit<T, 1>(x, packed, bits, n1, bias, y, g);
  if (pixels <= 1024) return launch_implicit<T, 2>(x, packed, bits, n1, bias, y, g);
  launch_implicit<T, 4>(x, packed, bits, n1, bias, y, g);
}

}  // namespace

// Implicit-GEMM conv2d, groups == 1, bits <= 4, fp16/bf16, sm_80+. x: [N, C, H, W], any strides.
at::Tensor nibble_conv2d(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                         at::IntArrayRef weight_shape, const std::optional<at::Tensor>& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding,
                         at::IntArrayRef dilation) {
  check_conv_args(x, packed, bits, weight_shape, bias);
  TORCH_CHECK(bits <= 4, "inq: nibble_conv2d needs bits <= 4");
  TORCH_CHECK(weight_shape[1] == x.size(1), "inq: nibble_conv2d needs groups == 1");
  const c10::cuda::CUDAGuard guard(x.device());
  int major = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                        x.get_device()));
  TORCH_CHECK(major >= 8, "inq: nibble_conv2d needs tensor cores of sm_80 or newer");
  const ConvGeometry g = geometry(x, weight_shape, stride, padding, dilation);
  at::Tensor y = at::empty({g.N, g.O, g.OH, g.OW}, x.options());
  if (y.numel() == 0) return y;
  switch (x.scalar_type()) {
    case at::kHalf: dispatch_implicit<__half>(x, packed, bits, n1, bias, y, g); break;
    case at::kBFloat16: dispatch_implicit<__nv_bfloat16>(x, packed, bits, n1, bias, y, g); break;
    default: TORCH_CHECK(false, "inq: nibble_conv2d needs float16 or bfloat16 activations");
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

// x: [N, C, H, W] (any strides); packed: [O, ceil(kh*kw*w/8)] with O = C * mult.
// Returns y: [N, O, OH, OW], contiguous like the reference op's result.
at::Tensor depthwise_conv2d(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                            int64_t n1, at::IntArrayRef weight_shape,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation) {
  check_conv_args(x, packed, bits, weight_shape, bias);
  TORCH_CHECK(weight_shape[1] == 1 && weight_shape[0] % x.size(1) == 0,
              "inq: depthwise_conv2d needs a weight [C * mult, 1, kh, kw]");
  ConvGeometry g = geometry(x, weight_shape, stride, padding, dilation);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor y = at::empty({g.N, g.O, g.OH, g.OW}, x.options());
  for (int d = 0; d < 4; ++d) g.ys[d] = y.stride(d);
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
