"""Build and load the CUDA extension (``inq/kernels/csrc``) with ``torch.utils.cpp_extension``.

The extension is compiled with ninja on first use and cached: a later process with the same
sources, flags and torch finds the shared library and only imports it. ``inq build-kernels``
(:func:`build_kernels_main`) builds ahead of time, e.g. in a Docker image or in CI, where it also
proves that the sources compile (no GPU needed for that).

Environment:

- ``CUDA_HOME`` (or ``CUDA_PATH``): the CUDA toolkit. If unset, the toolkit of the ``nvcc`` on
  ``PATH`` is asked for its location, so wrapper scripts and symlinks work.
- ``TORCH_CUDA_ARCH_LIST``: the GPU architectures to compile for, e.g. ``"9.0"``. If unset, torch
  uses the visible GPUs; with no GPU visible the build targets ``9.0`` (H100/H200).
- ``INQ_KERNEL_CACHE``: the build and cache folder (default ``~/.cache/inq/kernels``).

Example:
    >>> from inq.kernels.build import find_cuda_home
    >>> home = find_cuda_home()  # None where no CUDA toolkit is installed
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

__all__ = [
    "BUILD_KERNELS_HELP",
    "CSRC",
    "DEFAULT_ARCH_LIST",
    "KernelBuildError",
    "add_build_kernels_arguments",
    "build",
    "build_kernels_main",
    "cache_dir",
    "find_cuda_home",
    "load_extension",
    "run_build_kernels",
]

CSRC = Path(__file__).resolve().parent / "csrc"
DEFAULT_ARCH_LIST = "9.0"
_NAME = "inq_kernels"
_SOURCES = ("bindings.cpp", "linear.cu", "conv.cu", "int8.cu")
_CUDA_FLAGS = ["-O3", "-lineinfo", "-Xptxas=-warn-spills"]
BUILD_KERNELS_HELP = "compile the CUDA kernels ahead of time (needs nvcc, not a GPU)"


class KernelBuildError(RuntimeError):
    """The CUDA extension could not be compiled or imported; the message says why."""


def find_cuda_home() -> str | None:
    """The CUDA toolkit folder: ``$CUDA_HOME``, ``$CUDA_PATH``, or where ``nvcc`` on PATH lives.

    ``nvcc --dryrun`` prints the folder it runs from, which also resolves wrapper scripts.
    Returns None when no toolkit with ``bin/nvcc`` is found.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return home
    nvcc = shutil.which("nvcc")
    if nvcc is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [nvcc, "--dryrun", "-v", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                capture_output=True,
                text=True,
                timeout=60,
            )
            match = re.search(r"_HERE_=(\S+)", out.stdout + out.stderr)
            if match and (Path(match.group(1)) / "nvcc").exists():
                return str(Path(match.group(1)).parent)
    default = Path("/usr/local/cuda")
    return str(default) if (default / "bin" / "nvcc").exists() else None


def cache_dir() -> Path:
    """Where builds go: ``$INQ_KERNEL_CACHE`` or ``~/.cache/inq/kernels``, per torch version."""
    root = os.environ.get("INQ_KERNEL_CACHE") or Path.home() / ".cache" / "inq" / "kernels"
    tag = re.sub(r"[^A-Za-z0-9.]+", "_", f"torch{torch.__version__}")
    return Path(root) / tag


def build(verbose: bool = False) -> ModuleType:
    """Compile the extension if the cache holds no up-to-date build, import it, return it.

    Needs ``nvcc`` and ninja, not a GPU.

    Raises:
        KernelBuildError: with the reason (no CUDA toolkit, no ninja, compiler errors).
    """
    if torch.version.cuda is None:
        raise KernelBuildError("this torch was built without CUDA; install a CUDA build of torch")
    home = find_cuda_home()
    if home is None:
        raise KernelBuildError("no CUDA toolkit found: put nvcc on PATH or set CUDA_HOME")
    if shutil.which("ninja") is None:
        raise KernelBuildError("ninja is missing: pip install ninja")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    # torch rebuilds when a listed source or a flag changes; headers are not listed, so their
    # hash goes into a flag.
    header_hash = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(CSRC.glob("*.cuh"))))
    with _cuda_env(home), _arch_list():
        # Likewise the architectures: torch reads them from the environment, not the flags.
        arch = re.sub(r"\W", "_", os.environ.get("TORCH_CUDA_ARCH_LIST") or _visible_arch_list())
        flags = [
            *_CUDA_FLAGS,
            f"-DINQ_HEADERS={header_hash.hexdigest()[:16]}",
            f"-DINQ_ARCH={arch}",
        ]
        from torch.utils import cpp_extension

        # Its module-level CUDA_HOME was fixed when it was first imported, maybe without ours.
        cpp_extension.CUDA_HOME = home
        try:
            return cpp_extension.load(
                name=_NAME,
                sources=[str(CSRC / s) for s in _SOURCES],
                extra_cflags=["-O3"],
                extra_cuda_cflags=flags,
                build_directory=str(folder),
                verbose=verbose,
            )
        except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
            raise KernelBuildError(f"building the inq CUDA kernels failed: {err}") from err


@functools.cache
def load_extension() -> ModuleType | None:
    """The extension, built on first use; None (with one warning) if it cannot be built.

    The result is cached for the process, so the warning appears once and the reference ops
    (pure PyTorch) run instead.
    """
    try:
        return build()
    except KernelBuildError as err:
        warnings.warn(
            f"inq: CUDA kernels unavailable, using the PyTorch reference ops instead ({err})",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def add_build_kernels_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``inq build-kernels``."""
    parser.add_argument("-v", "--verbose", action="store_true", help="show compiler commands")


def run_build_kernels(args: argparse.Namespace) -> int:
    """Compile the CUDA extension ahead of time; exit status 0 on success, 1 on failure."""
    start = time.perf_counter()
    try:
        module = build(verbose=args.verbose)
    except KernelBuildError as err:
        print(f"inq build-kernels: {err}", file=sys.stderr)
        return 1
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST") or _visible_arch_list() or DEFAULT_ARCH_LIST
    print(
        f"inq build-kernels: built {module.__file__} for sm {arch} "
        f"in {time.perf_counter() - start:.0f} s (cache: {cache_dir()})"
    )
    return 0


def build_kernels_main(argv: list[str] | None = None) -> int:
    """``inq build-kernels [-v]`` as a function of its arguments."""
    parser = argparse.ArgumentParser(prog="inq build-kernels", description=BUILD_KERNELS_HELP)
    add_build_kernels_arguments(parser)
    return run_build_kernels(parser.parse_args(argv))


@contextlib.contextmanager
def _cuda_env(home: str) -> Iterator[None]:
    """``CUDA_HOME`` set for the build's subprocesses, restored afterwards."""
    old = os.environ.get("CUDA_HOME")
    os.environ["CUDA_HOME"] = home
    try:
        yield
    finally:
        if old is None:
            del os.environ["CUDA_HOME"]
        else:
            os.environ["CUDA_HOME"] = old


@contextlib.contextmanager
def _arch_list() -> Iterator[None]:
    """``TORCH_CUDA_ARCH_LIST`` defaulted to sm_90 while building when it is unset and no GPU
    is visible (torch would otherwise fail to pick an architecture)."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST") or _visible_arch_list():
        yield
        return
    os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LIST
    try:
        yield
    finally:
        del os.environ["TORCH_CUDA_ARCH_LIST"]


def _visible_arch_list() -> str:
    if not torch.cuda.is_available():
        return ""
    caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in caps)
