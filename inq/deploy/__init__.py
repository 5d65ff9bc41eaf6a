"""Everything that turns a finished model into something a runtime or a tool runs: the ONNX
float and Q/DQ graphs (:mod:`inq.deploy.onnx`, :mod:`inq.deploy.qdq`), TensorRT's form
(:mod:`inq.deploy.tensorrt`), QONNX and hls4ml (:mod:`inq.deploy.qonnx`,
:mod:`inq.deploy.hls4ml`), OpenVINO (:mod:`inq.deploy.openvino`), the runtime benchmark
(:mod:`inq.deploy.bench`) and the verification of inq's files (:mod:`inq.deploy.verify`).
"""
