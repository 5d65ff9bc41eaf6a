"""Integer-only deployment of a finished INQ model: int8 activations, BatchNorm folded into
per-channel requantization, an integer model bit-exact with its reference.

- :mod:`inq.quant.observers`: activation ranges and power-of-two scales (max, percentile, mse);
- :mod:`inq.quant.fakequant`: straight-through fake quantization with a learnable log2 scale;
- :mod:`inq.quant.trace`: trace a packed model and plan its integer ops (a table per node kind);
- :mod:`inq.quant.lower`: calibrate it, fine-tune it, lower it to integers;
- :mod:`inq.quant.integer`: the integer model, its reference arithmetic and its file;
- :mod:`inq.quant.pipeline`: the settings and the whole path on a trained model's data.

:mod:`inq.quant.lower` shows the whole path in its example; ``inq calibrate`` and
``inq-train quant.act_bits=8`` run it on a trained model (:mod:`inq.quant.pipeline`).
"""
