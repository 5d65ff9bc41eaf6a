"""Everything that turns a finished model into something a runtime or a tool runs: the ONNX
float and Q/DQ graphs (:mod:`inq.deploy.onnx`, :mod:`inq.deploy.qdq`), TensorRT's form
(:mod:`inq.deploy.tensorrt`), QONNX and hls4ml (:mod:`inq.deploy.qonnx`,
:mod:`inq.deploy.hls4ml`), OpenVINO (:mod:`inq.deploy.openvino`), the runtime benchmark
(:mod:`inq.deploy.bench`) and the verification of inq's files (:mod:`inq.deploy.verify`).

Each target of ``inq export`` is a :class:`~inq.deploy.target.Target` in its module (what it
reads, its options, what it writes, how its output is checked); :data:`TARGETS` lists them in
the order ``inq export --help`` shows their flags. A new target: its module, and its line here.

Example:
    >>> list(TARGETS)
    ['onnx', 'qonnx', 'hls4ml', 'rtl']
"""

from __future__ import annotations

from inq.deploy import hls4ml, onnx, qonnx, rtl
from inq.deploy.target import Target

__all__ = ["TARGETS", "Target"]

TARGETS: dict[str, Target] = {
    target.name: target for target in (onnx.TARGET, qonnx.TARGET, hls4ml.TARGET, rtl.TARGET)
}
