// Python bindings of the inq CUDA extension. The ops themselves (torch.ops.inq.*) are defined in
// Python (inq/kernels/ops.py, inq/kernels/int8.py); inq/kernels/cuda.py registers these
// functions as their CUDA implementations.
#include <torch/extension.h>

namespace inq {
at::Tensor shift_linear_small_batch(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                                    int64_t n1, int64_t in_features,
                                    const std::optional<at::Tensor>& bias);
at::Tensor decode_weight(const at::Tensor& packed, int64_t bits, int64_t n1, int64_t in_features,
                         at::ScalarType dtype);
at::Tensor depthwise_conv2d(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                            int64_t n1, at::IntArrayRef weight_shape,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef dilation);
at::Tensor nibble_conv2d(const at::Tensor& x, const at::Tensor& packed, int64_t bits, int64_t n1,
                         at::IntArrayRef weight_shape, const std::optional<at::Tensor>& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding,
                         at::IntArrayRef dilation);
at::Tensor shift_linear_int8(const at::Tensor& x, const at::Tensor& packed, int64_t bits,
                             int64_t in_features, int64_t frac_bits);
}  // namespace inq

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "inq: CUDA kernels on packed power-of-two weight codes";
  m.def("shift_linear_small_batch", &inq::shift_linear_small_batch,
        "Fused decode + GEMV / skinny GEMM: y[B, O] from x[B, K] and packed codes");
  m.def("decode_weight", &inq::decode_weight, "Dense weight [O, K] in the given dtype");
  m.def("depthwise_conv2d", &inq::depthwise_conv2d, "Depthwise conv2d on packed codes");
  m.def("nibble_conv2d", &inq::nibble_conv2d,
        "Implicit-GEMM conv2d on nibble codes with tensor cores (groups == 1)");
  m.def("shift_linear_int8", &inq::shift_linear_int8,
        "int32 shift-and-add linear on int8 activations");
}
