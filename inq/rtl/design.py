"""The integer model as a streaming Verilog design: one layer per op, each a window over the
stream (``window.v``: line buffers) feeding one pipelined adder graph (:mod:`inq.rtl.logic`)
that is reused for every output pixel, at one pixel a cycle.

Layers and the top level:

- conv, maxpool, avgpool, relu, clamp: a window of the op's kernel over its input; relu and
  clamp a 1x1 window; a global average pool a window the size of its input;
- flatten + linear: one window over the whole input frame (in the flatten's order);
- add (a residual join): a FIFO on each operand's stream (``fifo.v``), sized by a cycle model of
  the two branches at full rate (:func:`fifo_depths`; the simulation stops on an overflow), and
  a pair of pixels taken whenever both hold one;
- the top level ``inq_top``: a valid/ready input stream of pixels (raster order, channels
  packed, channel 0 at the least significant bits) and a valid/ready output stream of the last
  op's pixels (int32 fields). A pixel taken is registered before the layers read it (a cycle
  of latency, the handshake's logic off the layers' paths). After a frame's last pixel it holds
  ``in_ready`` low for :attr:`Design.frame_gap` cycles, the layers' flush ticks, and it starts
  a frame only while its output buffer has room for it (``FRAMES`` frames), so a consumer that
  stalls loses nothing.

One pixel enters per cycle: a frame takes ``H * W + frame_gap`` cycles (the initiation
interval, :attr:`Design.interval`).

A value may feed several layers (a branch); the streams of an add must have the same shape.
Refused, in one line naming the op: slices and pads, dilated or grouped convolutions, padded
pooling, windows whose outputs are not due in raster order.

Example::

    design = plan(load_integer("model.int.safetensors"), (1, 8, 8))
    files, pipelines = write_design(design, stage_delay=6.0)  # {file name: Verilog text}
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from importlib import resources

from da4ml.codegen.rtl.verilog.pipeline import pipeline_logic_gen
from da4ml.types import Pipeline
from torch import Tensor

from inq.quant.integer import IntegerModel, IntOp
from inq.rtl.logic import OutputField, Window, field_width, layer_graph, output_fields, pipelined

__all__ = ["OUT_WIDTH", "Design", "Layer", "RtlRefusal", "plan", "write_design"]

OUT_WIDTH = 32  # bits of each field of the last op's output (int32, as the integer model's)
FRAMES = 4  # frames the top level's output buffer holds
_POINTWISE = ("relu", "clamp")


class RtlRefusal(ValueError):
    """An op the RTL export has no streaming form for (the message names it)."""


@dataclass
class Layer:
    """One streaming layer: ``op`` on windows of ``window`` over an ``h x w`` input frame,
    reading the streams of the layers named in ``sources`` (``""``: the top level's input)."""

    op: IntOp
    sources: tuple[str, ...]
    window: Window
    h: int
    w: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    out_h: int
    out_w: int
    out_channels: int
    out_lo: int
    out_hi: int
    tensors: dict[str, Tensor]

    @property
    def name(self) -> str:
        return "layer" + self.op.name if self.op.name[0] == "_" else "layer_" + self.op.name

    @property
    def in_width(self) -> int:
        return field_width(self.window.lo, self.window.hi)

    @property
    def out_width(self) -> int:
        return field_width(self.out_lo, self.out_hi)

    def due(self, i: int, j: int) -> int:
        """Raster index of the input pixel after which output ``(i, j)`` is due."""
        (sh, sw), (ph, pw) = self.stride, self.padding
        return (i * sh - ph + self.window.kh - 1) * self.w + j * sw - pw + self.window.kw - 1

    def dues(self) -> list[int]:
        """:meth:`due` of every output, in raster order."""
        return [self.due(i, j) for i in range(self.out_h) for j in range(self.out_w)]

    @property
    def flush(self) -> int:
        return max(0, self.due(self.out_h - 1, self.out_w - 1) - (self.h * self.w - 1))


@dataclass
class Design:
    """The layers of a model in stream order, with the frame's geometry."""

    layers: list[Layer]
    in_channels: int
    in_h: int
    in_w: int
    in_lo: int
    in_hi: int

    @property
    def frame_gap(self) -> int:
        """Idle cycles after each frame's last pixel: every layer's flush."""
        return sum(layer.flush for layer in self.layers)

    @property
    def out_shape(self) -> tuple[int, int, int]:
        """``(C, H, W)`` of the last op's output: ``H * W`` beats a frame."""
        last = self.layers[-1]
        return last.out_channels, last.out_h, last.out_w

    @property
    def interval(self) -> int:
        """Cycles from one frame's first pixel to the next one's, at full rate."""
        return self.in_h * self.in_w + self.frame_gap


def _pair(value: int | list[int] | None, default: int) -> tuple[int, int]:
    if value is None:
        return default, default
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[1])


def _refuse(op: IntOp, why: str) -> RtlRefusal:
    return RtlRefusal(f"{op.name} ({op.op}): {why}")


@dataclass(frozen=True)
class _Stream:
    """A value as a stream: the layer that sends it (``""``: the input), its frame and range,
    and, after a flatten, the frame a linear op reads whole."""

    source: str
    channels: int
    h: int
    w: int
    lo: int
    hi: int
    flat: bool = False


def plan(model: IntegerModel, shape: tuple[int, int, int]) -> Design:
    """The streaming layers of ``model`` for inputs of ``shape`` ``(C, H, W)``.

    Raises:
        RtlRefusal: an op (or graph shape) with no streaming form here, naming it.
    """
    ops = model.ops
    if not ops or ops[0].op != "input":
        raise RtlRefusal("the program does not start with its input op")
    channels, h, w = shape
    lo, hi = ops[0].attrs["lo"], ops[0].attrs["hi"]
    design = Design([], channels, h, w, lo, hi)
    streams = {ops[0].name: _Stream("", channels, h, w, lo, hi)}
    for op in ops[1:]:
        inputs = [streams[name] for name in op.inputs]
        x = inputs[0]
        if op.op == "flatten":
            streams[op.name] = _Stream(x.source, x.channels, x.h, x.w, x.lo, x.hi, flat=True)
            continue
        if x.flat and op.op != "linear":
            raise _refuse(op, "follows a flatten; only a linear op may")
        window, stride, padding = _window_of(op, inputs)
        out_h = (x.h + 2 * padding[0] - window.kh) // stride[0] + 1
        out_w = (x.w + 2 * padding[1] - window.kw) // stride[1] + 1
        a = op.attrs
        out_channels = (
            a["weight_shape"][0] if op.op == "conv"
            else a["out_features"] if op.op == "linear" else x.channels
        )  # fmt: skip
        sources = tuple(i.source for i in inputs)
        layer = Layer(op, sources, window, x.h, x.w, stride, padding, out_h, out_w,
                      out_channels, a["lo"], a["hi"], model.op_tensors(op.name))  # fmt: skip
        _check_order(layer)
        design.layers.append(layer)
        streams[op.name] = _Stream(layer.name, out_channels, out_h, out_w, a["lo"], a["hi"])
    if ops[-1].op == "flatten":
        raise RtlRefusal("the program ends in a flatten: end it in a linear op")
    if not design.layers:
        raise RtlRefusal("the program has no layer to stream")
    return design


def _window_of(op: IntOp, inputs: list[_Stream]) -> tuple[Window, tuple[int, int], tuple[int, int]]:
    a, x = op.attrs, inputs[0]
    channels, h, w, lo, hi = x.channels, x.h, x.w, x.lo, x.hi
    if op.op == "linear":
        if channels * h * w != a["in_features"]:
            raise _refuse(op, f"{a['in_features']} inputs from a {channels}x{h}x{w} frame")
        return Window(h, w, channels, lo, hi), (1, 1), (0, 0)
    if op.op == "add":
        y = inputs[1]
        if x.flat or y.flat or (y.channels, y.h, y.w) != (channels, h, w):
            raise _refuse(op, f"adds a {y.channels}x{y.h}x{y.w} stream to a {channels}x{h}x{w} one")
        return Window(1, 1, channels, lo, hi, other=(y.lo, y.hi)), (1, 1), (0, 0)
    if op.op == "conv":
        _o, cg, kh, kw = a["weight_shape"]
        if a["groups"] != 1 or list(a["dilation"]) != [1, 1]:
            raise _refuse(op, "grouped or dilated convolutions do not stream here yet")
        if cg != channels:
            raise _refuse(op, f"{cg} input channels, the stream has {channels}")
        return Window(kh, kw, channels, lo, hi), _pair(a["stride"], 1), _pair(a["padding"], 0)
    if op.op in ("maxpool", "avgpool"):
        if a.get("kernel") is None:  # global average pooling
            return Window(h, w, channels, lo, hi), (1, 1), (0, 0)
        padding = _pair(a.get("padding"), 0)
        if padding != (0, 0) or a.get("ceil_mode") or _pair(a.get("dilation"), 1) != (1, 1):
            raise _refuse(op, "padded, dilated or ceil-mode pooling does not stream here yet")
        kernel = _pair(a["kernel"], 1)
        return Window(*kernel, channels, lo, hi), _pair(a["stride"], kernel[0]), (0, 0)
    if op.op in _POINTWISE:
        return Window(1, 1, channels, lo, hi), (1, 1), (0, 0)
    raise _refuse(op, "no streaming form for this op in the RTL export")


def _check_order(layer: Layer) -> None:
    """Refuse a window whose outputs would not fall due one after another in raster order."""
    dues = layer.dues()
    if dues[0] < 0 or any(b <= a for a, b in itertools.pairwise(dues)):
        raise _refuse(layer.op, "its windows are not due in raster order (padding too large)")


def _source(name: str) -> str:
    """A Verilog module shipped with inq (``window.v``, ``fifo.v``)."""
    return resources.files("inq.rtl").joinpath(name).read_text()


def _field_expr(raw: str, field: OutputField, width: int) -> str:
    """A ``width``-bit two's complement expression of one da4ml output field (an integer:
    its raw bits times ``2**-frac``)."""
    if field.width == 0:
        return f"{width}'d{field.const % (1 << width)}"
    bits = f"{raw}[{field.offset + field.width - 1}:{field.offset}]"
    value = f"$signed({bits})" if field.signed else f"$signed({{1'b0, {bits}}})"
    if field.frac < 0:  # the field holds value / 2**-frac
        value = f"({value} <<< {-field.frac})"
    elif field.frac > 0:  # da4ml kept fraction bits the integer value leaves at 0
        value = f"({value} >>> {field.frac})"
    return value


def _window_front(layer: Layer) -> str:
    """The line buffers: ``window_valid`` and ``window`` from the layer's input stream."""
    win = layer.window
    (sh, sw), (ph, pw) = layer.stride, layer.padding
    nb = max(8, (layer.h * layer.w + layer.flush + 2).bit_length() + 2)
    return f"""    wire window_valid;
    wire [{win.taps * layer.in_width - 1}:0] window;
    inq_window #(.H({layer.h}), .W({layer.w}), .C({win.channels}), .B({layer.in_width}),
        .KH({win.kh}), .KW({win.kw}), .SH({sh}), .SW({sw}), .PH({ph}), .PW({pw}),
        .OH({layer.out_h}), .OW({layer.out_w}), .FLUSH({layer.flush}), .NB({nb})) lines (
        .clk(clk), .rst(rst), .in_valid(in_valid), .in_data(in_data),
        .out_valid(window_valid), .out_data(window));"""


def _join_front(layer: Layer, depths: tuple[int, int]) -> str:
    """Two FIFOs: ``window`` is a pixel of each operand, taken when both hold one."""
    fifos, heads = [], []
    for name, suffix, width, depth in zip("xy", ("", "_b"), _operand_widths(layer), depths,
                                          strict=True):  # fmt: skip
        bits = layer.window.channels * width
        fifos.append(
            f"    wire {name}_ready;\n    wire [{bits - 1}:0] {name}_head;\n"
            f"    inq_fifo #(.WIDTH({bits}), .DEPTH({depth}), .AB({max(1, depth.bit_length())}))"
            f" {name}_fifo (\n        .clk(clk), .rst(rst), .push(in_valid{suffix}), "
            f".in_data(in_data{suffix}), .pop(take), .nonempty({name}_ready), .head({name}_head));"
        )
        heads.insert(0, f"{name}_head")
    bits = layer.window.channels * sum(_operand_widths(layer))
    body = "\n".join(fifos)
    return f"""    wire take;
{body}
    assign take = x_ready && y_ready;
    reg window_valid;
    reg [{bits - 1}:0] window;
    always @(posedge clk) begin
        window_valid <= rst ? 1'b0 : take;
        window <= {{{", ".join(heads)}}};
    end"""


def _operand_widths(layer: Layer) -> list[int]:
    return [field_width(lo, hi) for lo, hi in layer.window.ranges]


def _input_ports(layer: Layer) -> str:
    ports = []
    for suffix, width in zip(("", "_b"), _operand_widths(layer), strict=False):
        bits = layer.window.channels * width
        ports.append(f"    input in_valid{suffix},\n    input [{bits - 1}:0] in_data{suffix},")
    return "\n".join(ports)


def _layer_module(layer: Layer, pipeline: Pipeline, graph_name: str, last: bool,
                  depths: tuple[int, int] | None) -> str:  # fmt: skip
    win = layer.window
    out_b = OUT_WIDTH if last else layer.out_width
    raw_bits = max((f.offset + f.width for f in output_fields(pipeline)), default=1)
    latency = len(pipeline.solutions) + 1
    fields = []
    for c, field in enumerate(output_fields(pipeline)):
        fields.append(f"    wire signed [63:0] value{c} = {_field_expr('raw', field, 64)};")
        fields.append(f"    assign out_data[{c * out_b} +: {out_b}] = value{c}[{out_b - 1}:0];")
    body = "\n".join(fields)
    size = f"{layer.out_h}x{layer.out_w}x{layer.out_channels}"
    if depths is None:
        front = _window_front(layer)
        what = f"{win.kh}x{win.kw} windows, {layer.h}x{layer.w}x{win.channels} -> {size}"
    else:
        front = _join_front(layer, depths)
        what = f"FIFOs of {depths[0]} and {depths[1]} pixels, {layer.h}x{layer.w}x{win.channels}"
    return f"""// {layer.op.name}: {layer.op.op}, {what}
// values {layer.out_lo}..{layer.out_hi}
module {layer.name} (
    input clk,
    input rst,
{_input_ports(layer)}
    output out_valid,
    output [{layer.out_channels * out_b - 1}:0] out_data
);
{front}
    wire [{raw_bits - 1}:0] raw;
    {graph_name} graph (.clk(clk), .model_inp(window), .model_out(raw));
    reg [{latency - 1}:0] valid;  // the graph's {latency} register stages
    always @(posedge clk) valid <= rst ? {latency}'d0 : {{valid[{latency - 2}:0], window_valid}};
    assign out_valid = valid[{latency - 1}];
    // verilator lint_off UNUSEDSIGNAL
{body}
    // verilator lint_on UNUSEDSIGNAL
endmodule
"""


def fifo_depths(
    design: Design, latencies: list[int], frames: int = 2
) -> dict[str, tuple[int, int]]:
    """The FIFO depths each add needs (by layer name), from a cycle model of the design with
    every layer's graph ``latencies``: input frames back to back at one pixel a cycle, the
    fastest the top level accepts them (gaps in the input only let a lagging branch catch
    up), each pixel reaching the layers that read the input a cycle after ``inq_top`` takes
    it (its input register). A window layer's output ``(i, j)`` leaves ``latency + 2`` cycles
    after its due pixel arrived (the window's input register, its window register, the
    graph's stages); an add's ``latency + 1`` after it takes a pair."""
    pixels = design.in_h * design.in_w
    times: dict[str, list[int]] = {  # when each input pixel reaches the layers: taken + 1
        "": [f * design.interval + i + 1 for f in range(frames) for i in range(pixels)]
    }
    depths = {}
    for layer, latency in zip(design.layers, latencies, strict=True):
        arrivals = [times[source] for source in layer.sources]
        if layer.op.op == "add":
            takes, depths[layer.name] = _join_times(arrivals[0], arrivals[1])
            times[layer.name] = [t + 1 + latency for t in takes]
        else:
            times[layer.name] = _window_times(layer, arrivals[0], latency)
    return depths


def _window_times(layer: Layer, arrivals: list[int], latency: int) -> list[int]:
    beats, dues = layer.h * layer.w, layer.dues()
    out = []
    for f in range(len(arrivals) // beats):
        shifted = [t + 1 for t in arrivals[f * beats : (f + 1) * beats]]
        shifted += [shifted[-1] + 1 + j for j in range(layer.flush)]
        out += [shifted[d] + 1 + latency for d in dues]
    return out


def _join_times(x: list[int], y: list[int]) -> tuple[list[int], tuple[int, int]]:
    """When an add takes each pair, and the most pixels each FIFO held."""
    pushes = (set(x), set(y))
    counts, most, takes = [0, 0], [1, 1], []
    t = min(x[0], y[0])
    while len(takes) < len(x):
        take = counts[0] > 0 and counts[1] > 0
        takes += [t] if take else []
        for side in (0, 1):
            counts[side] += (t in pushes[side]) - take
            most[side] = max(most[side], counts[side])
        t += 1
    return takes, (most[0], most[1])


def _stream_ports(in_bits: int) -> str:
    """The ports every top level shares: clock, reset, the input stream, the output handshake."""
    return f"""    input clk,
    input rst,
    input in_valid,
    output in_ready,
    input [{in_bits - 1}:0] in_data,
    output out_valid,
    input out_ready,"""


def _top_module(design: Design) -> str:
    last = design.layers[-1]
    in_width = field_width(design.in_lo, design.in_hi)
    in_bits = design.in_channels * in_width
    out_bits = last.out_channels * OUT_WIDTH
    beats = last.out_h * last.out_w
    pixels = design.in_h * design.in_w
    depth = FRAMES * beats
    chain = []
    for layer in design.layers:
        bits = layer.out_channels * (OUT_WIDTH if layer is last else layer.out_width)
        inputs = "".join(
            f".in_valid{suffix}({source or 'taken'}_valid), "
            f".in_data{suffix}({source or 'taken'}_data), "
            for suffix, source in zip(("", "_b"), layer.sources, strict=False)
        )
        chain.append(
            f"    wire {layer.name}_valid;\n    wire [{bits - 1}:0] {layer.name}_data;\n"
            f"    {layer.name} {layer.name}_i (.clk(clk), .rst(rst), {inputs}"
            f".out_valid({layer.name}_valid), .out_data({layer.name}_data));"
        )
    prev = (f"{last.name}_valid", f"{last.name}_data")
    layers = "\n".join(chain)
    ab = max(depth.bit_length(), 1) + 1
    pb = max(pixels.bit_length(), 1) + 1
    gb = max(design.frame_gap.bit_length(), 1) + 1
    bb = max(beats.bit_length(), 1) + 1
    return f"""// inq_top: the integer model as a stream. Input: one pixel a beat (raster order,
// {design.in_channels} channel(s) of {in_width} bits, channel 0 at bit 0). Output: one
// pixel of the last op a beat ({last.out_channels} int32 fields), {beats} beat(s) a frame.
// A frame takes {design.interval} cycles at full rate ({pixels} pixels + {design.frame_gap} idle).
module inq_top (
{_stream_ports(in_bits)}
    output [{out_bits - 1}:0] out_data
);
    localparam PIXELS = {pixels}, GAP = {design.frame_gap}, FRAMES = {FRAMES}, BEATS = {beats};
    reg [{pb - 1}:0] pixel;       // pixels of the current frame taken
    reg [{gb - 1}:0] gap;         // idle cycles still owed to the layers' flush
    reg [{ab - 1}:0] frames;      // frames started and not yet read out whole
    reg [{bb - 1}:0] beat;        // beats of the frame being read out
    assign in_ready = gap == 0 && (pixel != 0 || frames < FRAMES);
    wire fire = in_valid && in_ready;
    // the pixel taken, registered: the layers that read the input see a register's valid and
    // data, a cycle after the handshake, not its logic (in_ready's counters, in_valid)
    reg taken_valid;
    reg [{in_bits - 1}:0] taken_data;
    always @(posedge clk) begin
        taken_valid <= rst ? 1'b0 : fire;
        taken_data <= in_data;
    end

{layers}

    // the output buffer: FRAMES frames of BEATS beats. The out_ready pin reaches only the
    // read side's enables (the read position, its successor, its lap bit, the beat counter):
    // a frame read out whole reaches the frame count a cycle later, which only delays the
    // next frame's admission by that cycle, never overfills the buffer.
    reg [{out_bits - 1}:0] buffer [0:{depth - 1}];
    reg [{ab - 1}:0] head, head1, tail; // read position, the one after it, write position
    reg head_lap, tail_lap;             // each position's laps of the buffer, modulo 2
    reg beat_last;                      // beat == BEATS - 1
    reg frame_read;                     // a frame's last beat was read in the last cycle
    wire push = {prev[0]};
    wire pop = out_valid && out_ready;
    assign out_valid = head != tail || head_lap != tail_lap;
    assign out_data = buffer[head];
    always @(posedge clk) begin
        if (rst) begin
            pixel <= 0; gap <= 0; frames <= 0; beat <= 0; beat_last <= BEATS == 1;
            head <= 0; head1 <= {1 % depth}; tail <= 0; head_lap <= 0; tail_lap <= 0;
            frame_read <= 0;
        end else begin
            if (gap != 0) gap <= gap - 1;
            if (fire) begin
                if (pixel == PIXELS - 1) begin
                    pixel <= 0;
                    gap <= GAP;
                end else pixel <= pixel + 1;
            end
            if (push) begin
                buffer[tail] <= {prev[1]};
                tail <= tail == {depth - 1} ? 0 : tail + 1;
                if (tail == {depth - 1}) tail_lap <= !tail_lap;
            end
            if (pop) begin
                head <= head1;
                head1 <= head1 == {depth - 1} ? 0 : head1 + 1;
                if (head == {depth - 1}) head_lap <= !head_lap;
                beat <= beat_last ? 0 : beat + 1;
                beat_last <= beat_last ? BEATS == 1 : beat == BEATS - 2;
            end
            frame_read <= pop && beat_last;
            frames <= frames + (fire && pixel == 0) - frame_read;
        end
    end
endmodule
"""


def _board_module(design: Design) -> str:
    last = design.layers[-1]
    in_bits = design.in_channels * field_width(design.in_lo, design.in_hi)
    fields = last.out_channels
    sel = max(1, (fields - 1).bit_length())
    return f"""// inq_board: inq_top with few enough pins for a package (synthesis, placement only):
// the output beat is read one int32 field at a time, chosen by out_field.
module inq_board (
{_stream_ports(in_bits)}
    input [{sel - 1}:0] out_field,
    output [{OUT_WIDTH - 1}:0] out_word
);
    wire [{fields * OUT_WIDTH - 1}:0] out_data;
    inq_top top (.clk(clk), .rst(rst), .in_valid(in_valid), .in_ready(in_ready),
        .in_data(in_data), .out_valid(out_valid), .out_ready(out_ready), .out_data(out_data));
    assign out_word = out_field < {fields} ? out_data[out_field * {OUT_WIDTH} +: {OUT_WIDTH}] : 0;
endmodule
"""


def write_design(design: Design, stage_delay: float) -> tuple[dict[str, str], list[Pipeline]]:
    """Every Verilog file of ``design`` (name -> text): ``inq_top.v``, one file per layer with
    its adder graph's stages, ``window.v`` and the da4ml cells they use; and each layer's
    pipelined graph."""
    files = {"window.v": _source("window.v")}
    pipelines = [
        pipelined(layer_graph(layer.op, layer.tensors, layer.window), stage_delay)
        for layer in design.layers
    ]
    depths = fifo_depths(design, [len(p.solutions) + 1 for p in pipelines])
    if depths:
        files["fifo.v"] = _source("fifo.v")
    for layer, pipeline in zip(design.layers, pipelines, strict=True):
        graph_name = f"{layer.name}_graph"
        modules = pipeline_logic_gen(pipeline, graph_name, timescale=None)
        text = "\n".join(modules[name] for name in sorted(modules))
        module = _layer_module(layer, pipeline, graph_name, layer is design.layers[-1],
                               depths.get(layer.name))  # fmt: skip
        files[f"{layer.name}.v"] = module + "\n" + text
    files["inq_top.v"] = _top_module(design)
    files["inq_board.v"] = _board_module(design)
    text = "\n".join(files.values())
    for cell in sorted(resources.files("da4ml.codegen.rtl.verilog").joinpath("source").iterdir(),
                       key=lambda f: f.name):  # fmt: skip
        if cell.name.endswith(".v") and re.search(rf"\b{cell.name[:-2]}\b\s*#?\s*\(", text):
            files[cell.name] = cell.read_text()
    return files, pipelines
