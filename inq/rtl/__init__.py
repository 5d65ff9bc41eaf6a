"""The integer model as hardware: streaming Verilog of constant adder graphs (da4ml), simulated
with Verilator, synthesized with Yosys and placed with nextpnr (the ``rtl`` extra).

- :mod:`inq.rtl.logic`: each layer's arithmetic as a pipelined adder graph;
- :mod:`inq.rtl.design`: the layers as streams (line buffers) and the top level;
- :mod:`inq.rtl.sim`: the Verilator testbench, driven from Python;
- :mod:`inq.rtl.export`: ``inq export --rtl``, checked against the integer model;
- :mod:`inq.rtl.synth`: Yosys and nextpnr figures.
"""

from inq.rtl.export import STAGE_DELAY, RtlModel, export_rtl, rtl_problem
from inq.rtl.synth import hardware_line

__all__ = ["STAGE_DELAY", "RtlModel", "export_rtl", "hardware_line", "rtl_problem"]
