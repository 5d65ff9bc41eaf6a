"""``inq bench onnx``: ONNX Runtime CPU latency of ONNX files, side by side, in one run.

Every file runs in its own ``InferenceSession`` on the CPU execution provider (``ORT_ENABLE_ALL``
graph optimizations, ``--threads`` intra-op threads, one inter-op thread, sequential execution) on a
random normal float input of its input shape with the batch dimension set (fixed seed, so files of
one input shape get the same input). The runs happen in a worker process per runtime
(:class:`RuntimeWorkers`), not in the process that reads the files. For each (batch, threads)
setting every file is warmed up, then the files take turns run by run (round robin, the first of
each round rotating), so that machine noise hits all of them alike; a file's figure is the median of
its timed runs (``time.perf_counter``). The table shows milliseconds and the speed-up over the first
file (first / this; the first row is the reference, 1.00x). A file given twice is timed twice (its
rows ``name`` and ``name (2)``): the spread between them is the machine's noise.

``--peer`` adds ONNX Runtime's own int8 pipeline as a row, ``ort quantize_static``: the first
file (taken to be the float export) run through ``quant_pre_process`` (shape inference and
optimization; skipped, and said so, where it fails) and ``quantize_static`` in QDQ format with
per-channel QInt8 weights and QUInt8 activations, calibrated on a few batches of the data the
file records (``inq_data``) where that loads here, else on random normal inputs; the output
says which.

``--runtime openvino`` times the files in OpenVINO's CPU plugin instead, ``--runtime both`` in both
runtimes side by side: each runtime in its own worker process, the files interleaved within it as
above, the runtimes one after the other at each setting (while one times, the other waits, idle).
Timed in one process, run by run, the two runtimes' thread pools took cores from each other's runs
(ONNX Runtime's rows of a small model 1.3x to 5x slower than the same file timed alone); in separate
processes taking turns, ONNX Runtime's rows match the file timed alone. OpenVINO compiles each file
for the timed batch before any run is timed (``INFERENCE_NUM_THREADS`` = ``--threads``,
``NUM_STREAMS=1``, ``PERFORMANCE_HINT=LATENCY``, ``INFERENCE_PRECISION_HINT=f32``, so float layers
stay float32 on bf16-capable CPUs). The rows are then ``file [runtime]``, and "vs 1st" compares with
the first file in the same runtime. Without ``--repeats``, each runtime warms up once to judge the
count, and again right before its timed runs where the other ran in between. ``--peer`` is made by
ONNX Runtime either way; it is timed in every runtime chosen.

For each file it prints which kernels ORT runs the convs and linears in, counted on the optimized
graph saved at ``ORT_ENABLE_EXTENDED``: the level where the QDQ fusions (``QLinearConv``,
``QGemm``, ...) happen. ``ORT_ENABLE_ALL``, which is what is timed, adds only the
hardware-specific NCHWc layout of float convs (ORT warns that such a saved graph only fits the
machine it was made on); it turns no integer kernel into a float one or back. In OpenVINO it
prints the precision each conv/linear layer runs in (u8/i8: int8 kernels), read from the
runtime model compiled at the first batch (:func:`inq.deploy.openvino.layer_precisions`).

Example (shell)::

    inq bench onnx model.onnx model.qdq.onnx --peer --json experiments/onnx_bench.json
    inq bench onnx model.onnx --batches 1 --threads 1 2 4 --repeats 100
    inq bench onnx model.onnx model.qdq.onnx --runtime both
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inq.data import build_eval_loader, eval_data_config, input_shape
from inq.deploy.onnx import first_line, load_onnx
from inq.deploy.openvino import (
    F32,
    RUNTIMES,
    LayerPrecision,
    OpenVinoSession,
    compile_onnx,
    layer_precisions,
    openvino_version,
    precision_line,
    read_onnx,
)
from inq.deploy.qonnx import is_qonnx
from inq.fileio import atomic_path
from inq.runfiles import ONNX_MODEL, refuse_kind

__all__ = [
    "ONNX_HELP",
    "OnnxFile",
    "OpCounts",
    "Timing",
    "add_onnx_arguments",
    "count_ops",
    "ort_peer",
    "run_onnx",
    "time_setting",
]

ONNX_HELP = (
    "ONNX Runtime CPU latency of ONNX files side by side, optionally with ORT's own int8 "
    "quantization as a peer, and in OpenVINO: inq bench onnx A.onnx B.onnx [--peer] "
    "[--runtime both]"
)
PEER_NAME = "ort quantize_static"
SEED = 0
MAX_REPEATS, MIN_REPEATS, BUDGET_S = 50, 5, 2.0  # default: what fits in 2 s for the slowest file
CALIBRATION_BATCHES, CALIBRATION_BATCH = 4, 16
ISOLATION = "each runtime timed in its own worker process, the runtimes in turn at each setting"

INTEGER_OPS = frozenset(
    {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm",
     "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}
)  # fmt: skip
FLOAT_OPS = frozenset(
    {"Conv", "FusedConv", "NchwcConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul",
     "FusedMatMul"}
)  # fmt: skip
_NCHWC = "com.microsoft.nchwc"


def _ort() -> Any:
    """The ``onnxruntime`` module, or one message naming the extra that brings it."""
    try:
        import onnx  # noqa: F401  (reads the optimized graphs)
        import onnxruntime
    except ImportError as err:
        raise ValueError(
            f"inq bench onnx needs the onnx extra: pip install 'inq[onnx]' ({err.name} is missing)"
        ) from None
    return onnxruntime


# ---------------------------------------------------------------------------------- the files


@dataclass(frozen=True)
class OpCounts:
    """Op types of an optimized graph: convs/linears in integer and in float kernels, the rest.

    Example:
        >>> print(count_ops(["QLinearConv", "QLinearConv", "QGemm", "QuantizeLinear"]).line())
        conv/linear: 3 integer (2 QLinearConv, 1 QGemm), 0 float; other: 1 QuantizeLinear
    """

    integer: dict[str, int]
    float: dict[str, int]
    other: dict[str, int]

    def line(self) -> str:
        """One line: the conv/linear counts, then the other op types, most frequent first."""

        def part(counts: dict[str, int]) -> str:
            return ", ".join(f"{n} {op}" for op, n in counts.items())

        def group(counts: dict[str, int], kind: str) -> str:
            total = sum(counts.values())
            return f"{total} {kind}" + (f" ({part(counts)})" if counts else "")

        head = f"conv/linear: {group(self.integer, 'integer')}, {group(self.float, 'float')}"
        return head + (f"; other: {part(self.other)}" if self.other else "")


def count_ops(op_types: Iterable[str]) -> OpCounts:
    """Sort op types into :class:`OpCounts` (each group most frequent first)."""
    counts = Counter(op_types).most_common()
    return OpCounts(
        {op: n for op, n in counts if op in INTEGER_OPS},
        {op: n for op, n in counts if op in FLOAT_OPS},
        {op: n for op, n in counts if op not in INTEGER_OPS | FLOAT_OPS},
    )


@dataclass
class OnnxFile:
    """One file to time: its row name, input (name, shape without the batch) and what it
    records (``inq_data``), and the ops of its optimized graph."""

    path: Path
    name: str
    input: str
    shape: tuple[int, ...]
    data: dict[str, Any]
    fixed_batch: int | None = None  # the only batch a graph exported without a dynamic one takes
    ops: OpCounts = field(default_factory=lambda: count_ops([]))
    openvino: Any = None  # the file read by OpenVINO (an openvino.Model), where it is timed there
    precisions: list[LayerPrecision] = field(default_factory=list)  # OpenVINO's conv/linear


def read_file(path: Path, folder: Path, name: str | None = None) -> OnnxFile:
    """Load ``path`` in ONNX Runtime, count the ops of its optimized graph (saved in ``folder``)
    and find its input shape.

    Example::

        f = read_file(Path("model.onnx"), Path(tempfile.mkdtemp()))
        print(f.name, f.shape, f.ops.line())

    Raises:
        ValueError: the file is missing, not an ONNX model (:func:`inq.runfiles.file_kind`), not
            loadable (or inq's and changed since: :func:`inq.deploy.onnx.load_onnx`), a QONNX
            model (:func:`inq.deploy.qonnx.is_qonnx`), or has an input that
            is not one float tensor of a known shape.
    """
    refuse_kind(path, "bench onnx", (ONNX_MODEL,))
    ort = _ort()
    import onnx

    proto = load_onnx(path)  # refuses an inq file that no longer matches its digest
    if is_qonnx(proto):  # before ONNX Runtime names its first Quant node an unknown op
        raise ValueError(
            f"{path}: a QONNX model (Quant nodes): neither ONNX Runtime nor OpenVINO runs it, "
            "so inq bench onnx cannot time it; inq eval runs it in qonnx's executor"
        )
    options = _options(ort, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, threads=1)
    saved = folder / f"{len(list(folder.iterdir()))}.optimized.onnx"
    options.optimized_model_filepath = str(saved)
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        graph = onnx.load(str(saved), load_external_data=False).graph
    except Exception as err:  # onnx and onnxruntime raise their own kinds
        raise ValueError(f"{path}: cannot load as ONNX ({first_line(err)})") from None
    ops = count_ops("NchwcConv" if n.domain == _NCHWC else n.op_type for n in graph.node)
    data = json.loads(session.get_modelmeta().custom_metadata_map.get("inq_data", "{}"))
    inputs = session.get_inputs()
    if len(inputs) != 1 or inputs[0].type != "tensor(float)":
        kinds = [i.type for i in inputs]
        raise ValueError(f"{path}: takes inputs {kinds}; inq bench onnx times one float input")
    dims = inputs[0].shape
    if len(dims) < 2:
        raise ValueError(f"{path}: input {dims} has no batch dimension")
    if all(isinstance(d, int) and d > 0 for d in dims[1:]):
        shape = tuple(int(d) for d in dims[1:])
    elif data:  # a free size besides the batch: the recorded data says which
        shape = input_shape(eval_data_config(data, []))
    else:
        raise ValueError(f"{path}: input {dims} is not fixed and the file records no data")
    batch = dims[0] if isinstance(dims[0], int) and dims[0] > 0 else None
    return OnnxFile(path, name or path.name, inputs[0].name, shape, data, batch, ops)


def _options(ort: Any, level: Any, threads: int) -> Any:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: the timing output stays readable
    return options


# ---------------------------------------------------------------------------------- the peer


def ort_peer(source: OnnxFile, output: Path, folder: Path) -> str:
    """Write ONNX Runtime's static int8 quantization of ``source`` to ``output`` (intermediate
    files in ``folder``); returns how it was made (pre-processing and calibration data).

    Example::

        how = ort_peer(read_file(Path("model.onnx"), tmp), Path("model.ort.onnx"), tmp)

    Raises:
        ValueError: ONNX Runtime cannot quantize the model.
    """
    _ort()
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    inputs, calibration = calibration_inputs(source)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter({source.input: x} for x in inputs)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    model, pre = pre_process(source.path, folder / "pre.onnx")
    try:
        with _quiet():
            quantize_static(
                str(model),
                str(output),
                Reader(),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
            )
    except Exception as err:  # onnxruntime raises many kinds
        raise ValueError(
            f"--peer: ONNX Runtime cannot quantize {source.path}: {first_line(err)}"
        ) from None
    return f"{pre}, QDQ, per-channel QInt8 weights, QUInt8 activations, calibrated on {calibration}"


def pre_process(source: Path, output: Path) -> tuple[Path, str]:
    """``quant_pre_process`` of ``source`` into ``output``: shape inference, then ORT's basic
    optimizations (BatchNorm folded into the convs, ...). Where its symbolic shape inference
    fails (it does on some ``torch.onnx`` exports), again without it; where that fails too, the
    file as it is. Returns the model to quantize and what was done.

    Example::

        model, done = pre_process(Path("model.onnx"), Path(tmp) / "pre.onnx")
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    failed = ""
    for skip_symbolic in (False, True):
        try:
            with _quiet():
                quant_pre_process(str(source), str(output), skip_symbolic_shape=skip_symbolic)
        except Exception as err:  # its shape inference raises many kinds
            failed = first_line(err)[:80]
            continue
        done = "quant_pre_process"
        return output, done + (f" without symbolic shape inference ({failed})" if failed else "")
    return source, f"no quant_pre_process (it fails: {failed})"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No log records below ERROR (ORT's quantization tools warn on the root logger)."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def calibration_inputs(source: OnnxFile) -> tuple[list[np.ndarray], str]:
    """A few input batches for calibration: the recorded data's validation images where they
    load here, else random normal inputs; and a description of which.

    Example:
        >>> f = OnnxFile(Path("m.onnx"), "m.onnx", "input", (3, 8, 8), {"name": "synthetic",
        ...              "in_channels": 3, "image_size": 8})
        >>> inputs, what = calibration_inputs(f)
        >>> len(inputs), inputs[0].shape, what
        (4, (16, 3, 8, 8), '4 batches of 16 synthetic validation images')
    """
    if source.data:
        name = source.data.get("name")
        try:
            cfg = eval_data_config(source.data, [f"eval_batch_size={CALIBRATION_BATCH}"])
            if input_shape(cfg) != source.shape:
                raise ValueError(f"its images are {input_shape(cfg)}, not {source.shape}")
            loader = build_eval_loader(cfg)
            batches = [x.float().numpy() for x, _ in itertools.islice(loader, CALIBRATION_BATCHES)]
            size = batches[0].shape[0]
            return batches, f"{len(batches)} batches of {size} {name} validation images"
        except (ValueError, OSError) as err:  # a ConfigError is a ValueError
            why = f"{name} does not load here: {err}"
    else:
        why = "the file records no data"
    rng = np.random.default_rng(SEED)
    shape = (CALIBRATION_BATCH, *source.shape)
    batches = [rng.standard_normal(shape, dtype=np.float32) for _ in range(CALIBRATION_BATCHES)]
    what = f"{CALIBRATION_BATCHES} batches of {CALIBRATION_BATCH} random normal inputs ({why})"
    return batches, what


# ---------------------------------------------------------------------------------- timing


@dataclass
class Timing:
    """One file at one setting: the median and fastest of its timed runs, in milliseconds."""

    file: str
    batch: int
    threads: int
    repeats: int
    median_ms: float
    min_ms: float
    speedup: float  # the first file's median in the same runtime / this one's
    runtime: str = RUNTIMES[0]


def time_setting(
    files: Sequence[OnnxFile],
    batch: int,
    threads: int,
    repeats: int | None,
    warmup: int,
    runtimes: Sequence[str] = RUNTIMES[:1],
) -> list[Timing]:
    """Time every file in every runtime (``onnxruntime``, ``openvino``) at one (batch, threads)
    setting: each runtime in its own worker process (:class:`RuntimeWorkers`), the runtimes one
    after the other, the files interleaved run by run within each. OpenVINO compiles each file
    for the batch before any run is timed.

    ``repeats=None``: as many runs as fit in :data:`BUDGET_S` seconds for the slowest runner
    (judged from its last warm-up run), between :data:`MIN_REPEATS` and :data:`MAX_REPEATS`.

    Example::

        rows = time_setting([read_file(Path("a.onnx"), tmp)], batch=1, threads=1, repeats=20,
                            warmup=3)
        rows[0].median_ms
    """
    with RuntimeWorkers(runtimes) as workers:
        workers.load(files)
        return workers.time(batch, threads, repeats, warmup)


class RuntimeWorkers:
    """One worker process per runtime (``multiprocessing`` spawn: a fresh interpreter that
    loads only its own runtime's sessions), each timing every file in its runtime, files
    interleaved run by run. The runtimes take turns: while one times, the other waits on its
    pipe, so neither's thread pool (OpenVINO's, ONNX Runtime's spinning workers) takes cores
    from the other's runs, and ONNX Runtime is timed with the same settings alone and beside
    OpenVINO.

    Example::

        with RuntimeWorkers(["onnxruntime", "openvino"]) as workers:  # started, idle
            workers.load([read_file(Path("a.onnx"), tmp), read_file(Path("b.onnx"), tmp)])
            rows = workers.time(batch=1, threads=2, repeats=None, warmup=3)

    Raises:
        ValueError: a file does not run at a batch, or a worker process died.
    """

    def __init__(self, runtimes: Sequence[str]) -> None:
        self.files: list[OnnxFile] = []
        self.runtimes = list(runtimes)
        spawn = multiprocessing.get_context("spawn")
        self.pipes: list[Any] = []
        self.processes: list[Any] = []
        try:
            for runtime in self.runtimes:
                here, there = spawn.Pipe()
                process = spawn.Process(
                    target=_worker, args=(there, runtime), name=f"inq-bench-{runtime}", daemon=True
                )
                process.start()
                there.close()
                self.pipes.append(here)
                self.processes.append(process)
        except BaseException:
            self.close()
            raise

    def load(self, files: Sequence[OnnxFile]) -> None:
        """The files every worker times from now on (OpenVINO's worker reads them)."""
        self.files = list(files)
        listed = [(str(f.path), f.name, f.input, f.shape) for f in self.files]
        for i in range(len(self.runtimes)):
            self._ask(i, ("files", listed), "reading the files")

    def __enter__(self) -> RuntimeWorkers:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.close(wait=kind is None)  # after an error or Ctrl-C, a worker's runs are not needed

    @property
    def pids(self) -> dict[str, int]:
        """The worker process of each runtime."""
        return {r: p.pid for r, p in zip(self.runtimes, self.processes, strict=False)}

    def close(self, wait: bool = True) -> None:
        """Stop the workers: each ends when its pipe closes (``wait``: given 10 s to), or is
        killed."""
        for pipe in self.pipes:
            pipe.close()
        for process in self.processes:
            process.join(timeout=10 if wait else 0)
            if process.is_alive():  # busy with runs nobody will read
                process.kill()
                process.join()
        self.pipes, self.processes = [], []

    def _ask(self, i: int, message: tuple[Any, ...], doing: str) -> Any:
        runtime, process = self.runtimes[i], self.processes[i]
        try:
            self.pipes[i].send(message)
            kind, answer = self.pipes[i].recv()
        except (EOFError, OSError):
            process.join(timeout=10)
            raise ValueError(
                f"the {runtime} worker process died {doing} (exit code {process.exitcode})"
            ) from None
        if kind == "error":
            raise ValueError(answer)
        return answer

    def time(self, batch: int, threads: int, repeats: int | None, warmup: int) -> list[Timing]:
        """Every file in every runtime at one setting (see :func:`time_setting`): each runtime
        warms its files up, then times them; without ``repeats``, every runtime warms up first,
        the count is judged from the slowest, and a runtime that another ran after warms up
        again right before its timed runs."""
        setting = f"at batch {batch}, {threads} thread{'' if threads == 1 else 's'}"
        n = len(self.runtimes)
        before = [warmup] * n  # warm-up runs right before the timed ones
        if repeats is None:
            slowest = [self._ask(i, ("warm", batch, threads, warmup), setting) for i in range(n)]
            repeats = min(MAX_REPEATS, max(MIN_REPEATS, int(BUDGET_S / max(*slowest, 1e-9))))
            before[-1] = 0  # the last runtime warmed up just now; the others again
        s = "" if threads == 1 else "s"
        each = f"{len(self.files)} files" + (f" in {n} runtimes" if n > 1 else "")
        how = ", each runtime in its own process, in turn" if n > 1 else ""
        print(
            f"batch {batch}, {threads} thread{s}: {each}, {repeats} runs each, interleaved{how}",
            file=sys.stderr,
            flush=True,
        )
        times = {
            runtime: self._ask(i, ("time", batch, threads, before[i], repeats), setting)
            for i, runtime in enumerate(self.runtimes)
        }
        rows = [(j, f, r) for j, f in enumerate(self.files) for r in self.runtimes]
        medians = {(j, r): statistics.median(times[r][j]) for j, _, r in rows}
        return [
            Timing(f.name, batch, threads, repeats, medians[j, r], min(times[r][j]),
                   medians[0, r] / medians[j, r], r)
            for j, f, r in rows
        ]  # fmt: skip


def _worker(pipe: Any, runtime: str) -> None:
    """A worker process of :class:`RuntimeWorkers`: times files in ``runtime`` on request
    (``files``, then ``warm``/``time`` per setting) until its pipe closes; every answer is
    ``(kind, value)``, an error ``("error", one line)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which ends this
    files: list[OnnxFile] = []
    sessions: list[Any] = []
    feeds: list[dict[str, np.ndarray]] = []
    opened: tuple[int, int] | None = None

    def open_setting(batch: int, threads: int) -> None:
        nonlocal sessions, feeds, opened
        if opened != (batch, threads):
            sessions = []  # the previous setting's, freed first
            sessions = [_session(f, runtime, batch, threads) for f in files]
            rng = np.random.default_rng
            feeds = [{f.input: rng(SEED).standard_normal((batch, *f.shape), dtype=np.float32)}
                     for f in files]  # fmt: skip
            opened = (batch, threads)

    def warm(batch: int, runs: int) -> float:
        """``runs`` untimed runs of each file in turn; the last run of the slowest, in s."""
        slowest = 0.0
        for f, session, feed in zip(files, sessions, feeds, strict=True):
            took = 0.0
            for _ in range(runs):
                start = time.perf_counter()
                try:
                    session.run(None, feed)
                except Exception as err:  # onnxruntime and openvino raise their own kinds
                    raise ValueError(
                        f"{f.path}: does not run at batch {batch}: {first_line(err)}"
                    ) from None
                took = time.perf_counter() - start
            slowest = max(slowest, took)
        return slowest

    def timed(repeats: int) -> list[list[float]]:
        """``repeats`` rounds, one run of each file per round, the first rotating; ms."""
        times: list[list[float]] = [[] for _ in files]
        for r in range(repeats):
            for i in [(r + k) % len(files) for k in range(len(files))]:
                session, feed = sessions[i], feeds[i]
                start = time.perf_counter()
                session.run(None, feed)
                times[i].append((time.perf_counter() - start) * 1e3)
        return times

    while True:
        try:
            message = pipe.recv()
        except EOFError:  # the parent closed the pipe: done
            return
        try:
            if message[0] == "files":
                files = [OnnxFile(Path(path), name, input_, shape, {})
                         for path, name, input_, shape in message[1]]  # fmt: skip
                if runtime == "openvino":
                    for f in files:
                        f.openvino = read_onnx(f.path)
                answer: Any = len(files)
            elif message[0] == "warm":
                _, batch, threads, runs = message
                open_setting(batch, threads)
                answer = warm(batch, runs)
            else:  # "time"
                _, batch, threads, runs, repeats = message
                open_setting(batch, threads)
                warm(batch, runs)
                answer = timed(repeats)
        except Exception as err:  # one line back to the parent, which raises it
            reply = ("error", str(err) if isinstance(err, ValueError) else first_line(err))
        else:
            reply = ("ok", answer)
        try:
            pipe.send(reply)
        except OSError:  # the parent stopped (Ctrl-C, an error) while this one ran: done
            return


OPENVINO_CONFIG = {"NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}  # + the threads, f32
OPENVINO_SETTINGS = {**F32, **OPENVINO_CONFIG}  # INFERENCE_NUM_THREADS: each setting's threads


def _session(f: OnnxFile, runtime: str, batch: int, threads: int) -> Any:
    """What times ``f`` in ``runtime``: an ONNX Runtime session with all optimizations, or
    OpenVINO's model compiled for ``batch`` behind the same ``run``."""
    if runtime == "openvino":
        config = {**OPENVINO_CONFIG, "INFERENCE_NUM_THREADS": threads}
        return OpenVinoSession(compile_onnx(f.openvino, f.path, batch, config))
    ort = _ort()
    options = _options(ort, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, threads)
    try:
        return ort.InferenceSession(str(f.path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own kinds
        raise ValueError(
            f"{f.path}: cannot load with all optimizations: {first_line(err)}"
        ) from None


# ---------------------------------------------------------------------------------- output


def cpu_name() -> str:
    """The CPU's ``model name`` from ``/proc/cpuinfo``, or ``unknown CPU``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return "unknown CPU"


def row_label(name: str, runtime: str, runtimes: Iterable[str]) -> str:
    """A file's name, with its runtime beside it where any runtime but ONNX Runtime is timed.

    Example:
        >>> row_label("a.onnx", "openvino", ["onnxruntime", "openvino"])
        'a.onnx [openvino]'
        >>> row_label("a.onnx", "onnxruntime", ["onnxruntime"])
        'a.onnx'
    """
    return name if set(runtimes) <= {RUNTIMES[0]} else f"{name} [{runtime}]"


def format_table(timings: Sequence[Timing]) -> str:
    """Rows: files in runtimes (their names unique), in the order of ``timings``; columns:
    milliseconds and speed-up over the first file in the same runtime, per setting.

    Example:
        >>> t = [Timing("a.onnx", 1, 1, 5, 2.0, 1.9, 1.0), Timing("b.onnx", 1, 1, 5, 1.0, 1.0, 2.0)]
        >>> print(format_table(t))
        file     b=1 t=1 ms   vs 1st
        ----------------------------
        a.onnx        2.000    1.00x
        b.onnx        1.000    2.00x
    """
    settings = list(dict.fromkeys((t.batch, t.threads) for t in timings))
    rows = list(dict.fromkeys((t.file, t.runtime) for t in timings))
    runtimes = {runtime for _, runtime in rows}
    by = {((t.file, t.runtime), t.batch, t.threads): t for t in timings}
    labels = [row_label(name, runtime, runtimes) for name, runtime in rows]
    width = max(len("file"), *map(len, labels))
    columns = [f"b={b} t={n} ms" for b, n in settings]
    head = f"{'file':<{width}}" + "".join(f"{column:>13}{'vs 1st':>9}" for column in columns)
    lines = [
        f"{label:<{width}}"
        + "".join(
            f"{by[row, b, n].median_ms:>13.3f}{by[row, b, n].speedup:>8.2f}x" for b, n in settings
        )
        for label, row in zip(labels, rows, strict=True)
    ]
    return "\n".join([head, "-" * len(head), *lines])


# ---------------------------------------------------------------------------------- command


def add_onnx_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``inq bench onnx``.

    Example:
        >>> parser = argparse.ArgumentParser(prog="inq bench onnx")
        >>> add_onnx_arguments(parser)
        >>> args = parser.parse_args(["a.onnx", "b.onnx", "--threads", "4"])
        >>> args.files, args.batches, args.threads, args.repeats, args.runtime
        (['a.onnx', 'b.onnx'], [1, 32], [4], None, 'onnxruntime')
    """
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="ONNX files; the first is the reference of the speed-ups (and, with --peer, the "
        "float export)",
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], metavar="N",
                        help="batch sizes (default: 1 32)")  # fmt: skip
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], metavar="N",
                        help="intra-op threads (default: 1 2)")  # fmt: skip
    parser.add_argument(
        "--repeats",
        type=int,
        help=f"timed runs per file and setting (default: as many as fit in {BUDGET_S:g} s for "
        f"the slowest file, {MIN_REPEATS} to {MAX_REPEATS})",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed runs first (default: 3; 0 needs --repeats, the count is judged from them)",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="add ONNX Runtime's quantize_static (QDQ, per-channel int8) of the first file",
    )
    parser.add_argument(
        "--runtime",
        choices=[*RUNTIMES, "both"],
        default=RUNTIMES[0],
        help="which CPU runtime times the files: onnxruntime (default), openvino (pip install "
        "'inq[openvino]'), or both side by side",
    )
    parser.add_argument("--json", type=Path, help="write every figure here (and the peer beside)")


def run_onnx(args: argparse.Namespace) -> int:
    """Read the files (and build the peer), print their kernels, time them, print the table;
    exit status 0.

    Example::

        parser = argparse.ArgumentParser(prog="inq bench onnx")
        add_onnx_arguments(parser)
        run_onnx(parser.parse_args(["model.onnx", "model.qdq.onnx", "--batches", "1"]))

    Raises:
        ValueError: a bad setting, or a file that is missing or not a loadable ONNX model.
    """
    checks = {"--batches": args.batches, "--threads": args.threads, "--warmup": [args.warmup]}
    if args.repeats is not None:
        checks["--repeats"] = [args.repeats]
    for flag, values in checks.items():
        least = 0 if flag == "--warmup" else 1  # no warm-up is a choice; no timed run is not
        if min(values) < least:
            raise ValueError(f"{flag} {' '.join(map(str, values))}: must be at least {least}")
    if args.warmup == 0 and args.repeats is None:
        raise ValueError(
            "--warmup 0: give --repeats too (without it, the number of timed runs is judged "
            "from the last warm-up run)"
        )
    if args.json is not None:  # before any work
        _check_writable(args.json)
    ort = _ort()
    runtimes = list(RUNTIMES) if args.runtime == "both" else [args.runtime]
    ov_version = openvino_version() if "openvino" in runtimes else None  # the extra, before work
    # the workers start now: their interpreters load while this one reads the files
    with (
        RuntimeWorkers(runtimes) as workers,
        tempfile.TemporaryDirectory(prefix="inq-bench-onnx-") as tmp,
    ):
        folder = Path(tmp)
        graphs = folder / "optimized"
        graphs.mkdir()
        paths = [Path(p) for p in args.files]
        files = [
            read_file(p, graphs, name) for p, name in zip(paths, row_names(paths), strict=True)
        ]
        for f in files:
            if f.fixed_batch is not None and set(args.batches) != {f.fixed_batch}:
                raise ValueError(
                    f"{f.path}: the graph takes batch {f.fixed_batch} only (exported without a "
                    f"dynamic batch); use --batches {f.fixed_batch}"
                )
        peer = None
        if args.peer:
            quantized = _quantized(files[0].ops)
            if quantized:
                raise ValueError(
                    f"--peer quantizes the first file, the float export; {files[0].path} is "
                    f"quantized already ({quantized}): put the float export first"
                )
            output = folder / "peer.ort.onnx"
            how = ort_peer(files[0], output, folder)
            files.append(read_file(output, graphs, PEER_NAME))
            kept = None if args.json is None else args.json.with_name(args.json.stem + ".ort.onnx")
            peer = {"path": str(kept or output), "of": str(files[0].path), "how": how}
            where = "" if kept is None else f", written to {kept}"
            print(f"{PEER_NAME} of {files[0].path}: {how}{where}")
        if ov_version is not None:
            for f in files:
                f.openvino = read_onnx(f.path)
                f.precisions = layer_precisions(compile_onnx(f.openvino, f.path, args.batches[0]))
        lines = {
            row_label(f.name, runtime, runtimes): (
                f.ops.line() if runtime == RUNTIMES[0] else precision_line(f.precisions)
            )
            for f in files
            for runtime in runtimes
        }
        width = max(map(len, lines))
        for label, line in lines.items():
            print(f"{label:<{width}}  {line}")
        workers.load(files)
        timings = [
            t
            for batch, threads in itertools.product(args.batches, args.threads)
            for t in workers.time(batch, threads, args.repeats, args.warmup)
        ]
        if peer is not None and kept is not None:
            with atomic_path(kept) as target:
                target.write_bytes(output.read_bytes())
    cpu = cpu_name()
    runs = sorted({t.repeats for t in timings})
    repeats = f"{runs[0]}" if len(runs) == 1 else f"{runs[0]}-{runs[-1]}"
    timed = f"median of {repeats} runs after {args.warmup} warm-up, files interleaved"
    if RUNTIMES[0] in runtimes:
        print(
            f"ONNX Runtime {ort.__version__}, {cpu}, CPUExecutionProvider, ORT_ENABLE_ALL, "
            f"sequential, 1 inter-op thread; {timed}"
        )
    if ov_version is not None:
        print(
            f"OpenVINO {ov_version}, {cpu}, CPU plugin, PERFORMANCE_HINT=LATENCY, NUM_STREAMS=1, "
            f"INFERENCE_PRECISION_HINT=f32, compiled per batch before timing; {timed}"
        )
    if len(runtimes) > 1:
        print(f"{ISOLATION}: neither runtime's threads take cores from the other's runs")
        print("vs 1st: the speed-up over the first file in the same runtime")
    print(format_table(timings))
    if args.json is not None:
        payload = {
            "onnxruntime": ort.__version__,
            "openvino": ov_version,
            "cpu": cpu,
            "settings": {
                "provider": "CPUExecutionProvider",
                "graph_optimization": "ORT_ENABLE_ALL",
                "ops_counted_at": "ORT_ENABLE_EXTENDED",
                "execution": "sequential",
                "inter_op_threads": 1,
                "batches": args.batches,
                "threads": args.threads,
                "warmup": args.warmup,
                "repeats": args.repeats,
                "seed": SEED,
                "runtimes": runtimes,
                "isolation": ISOLATION if len(runtimes) > 1 else "one worker process",
                "openvino_config": None if ov_version is None else OPENVINO_SETTINGS,
            },
            "files": [_file_record(f, ov_version is not None) for f in files],
            "peer": peer,
            "results": [asdict(t) for t in timings],
        }
        replaced = " (replacing the previous one)" if args.json.exists() else ""
        with atomic_path(args.json) as target:
            target.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.json}{replaced}")
    return 0


def _check_writable(path: Path) -> None:
    """Refuse ``--json path`` in one line where the JSON (and the peer beside it) cannot be
    written: a directory, or a place where the nearest existing folder takes no new file (a
    temporary file made and deleted there, as the atomic write at the end will make one).

    Raises:
        ValueError: ``path`` is a directory, or its folder cannot be made or written in.
    """
    if path.is_dir():
        raise ValueError(f"--json {path}: a directory; name the file to write")
    folder = path.absolute().parent
    while not folder.exists():  # the folders still to make: the nearest that exists must take them
        folder = folder.parent
    if not folder.is_dir():
        raise ValueError(f"--json {path}: {folder} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as err:
        raise ValueError(f"--json {path}: cannot write in {folder} ({err.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def _file_record(f: OnnxFile, openvino: bool) -> dict[str, Any]:
    """What the JSON says of a file: its ORT ops and, where OpenVINO timed it, the precision
    of each conv/linear layer there."""
    record = {"name": f.name, "path": str(f.path), "input": list(f.shape), "ops": asdict(f.ops)}
    if openvino:
        record["openvino_precisions"] = precision_line(f.precisions)
        record["openvino_layers"] = [{**asdict(x), "int8": x.int8} for x in f.precisions]
    return record


def row_names(paths: Sequence[Path]) -> list[str]:
    """Unique row names: each file's name, its path where two names clash, and ``(2)``, ``(3)``
    ... for a file given again.

    Example:
        >>> row_names([Path("a/m.onnx"), Path("b/m.onnx"), Path("a/m.onnx"), Path("q.onnx")])
        ['a/m.onnx', 'b/m.onnx', 'a/m.onnx (2)', 'q.onnx']
    """
    names = [p.name if len({q for q in paths if q.name == p.name}) == 1 else str(p) for p in paths]
    return [name if names[:i].count(name) == 0 else f"{name} ({names[:i].count(name) + 1})"
            for i, name in enumerate(names)]  # fmt: skip


def _quantized(ops: OpCounts) -> str:
    """The quantized ops of a graph (``""`` for none): integer kernels, Q/DQ nodes."""
    qdq = {op: n for op, n in ops.other.items() if op in ("QuantizeLinear", "DequantizeLinear")}
    return ", ".join(f"{n} {op}" for op, n in {**ops.integer, **qdq}.items())
