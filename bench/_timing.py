"""Shared timing helpers for the benchmarks: machine record, interleaved timing, formatting.

Timing method (optimistix/lineax style): every JAX callable is compiled ahead of time with
``jit(f).lower(*args).compile()`` (so compile time is measured apart from run time and the
jitted function's own cache is warm), each timed call of a jax function ends in
``jax.block_until_ready``, and the variants being compared are called round-robin, one call
each per round in a random order, so that a slow phase of a noisy machine hits all of them
alike. The statistic reported is the median; min
and inter-quartile range are kept alongside.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
import platform
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import jax
import numpy as np

__all__ = (
    "NOISE",
    "Stats",
    "aot_compile",
    "fmt_ratio",
    "fmt_us",
    "machine_info",
    "program_text",
    "add_json_argument",
    "results_dir",
    "targets_md",
    "time_interleaved",
)


def results_dir() -> str:
    """Where the benchmarks write their JSON by default: ``bench/results/`` in a clone of
    fusedlp (the repository's committed results live there), else ``fusedlp-bench-results/``
    under the current directory, never inside an installed package (site-packages)."""
    package = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(os.path.dirname(package), "pyproject.toml")):
        return os.path.join(package, "results")
    return os.path.join(os.getcwd(), "fusedlp-bench-results")


def add_json_argument(p, name: str, help: str = "where to write the JSON results") -> None:
    """A benchmark's ``--json PATH`` option, defaulting to ``name`` in `results_dir`."""
    p.add_argument("--json", default=os.path.join(results_dir(), name), metavar="PATH",
                   help=f"{help} (default: bench/results/{name} in a clone, else "
                        f"fusedlp-bench-results/{name} here)")


# Ratios within 10 % of 1 are called a tie: timings move about that much on this machine,
# and the A/A pairs that bench kernels and bench fuse time (one program, two variants)
# spread about that far; both print their run's spread.
NOISE = 0.10


# --------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    """The checkout's commit (``-dirty`` with uncommitted changes); None outside a git clone."""
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"],
                             cwd=os.path.dirname(os.path.abspath(__file__)),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    # a copy without .git (a lent GPU machine gets the working tree alone) names its commit
    return out.stdout.strip() or os.environ.get("FUSEDLP_COMMIT") or None


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f.startswith(("avx", "fma", "sse4")))
    except OSError:
        pass
    return []


def machine_info() -> dict:
    """What the numbers were measured on."""
    import jaxlib

    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_simd_flags": _cpu_flags(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "jax_enable_x64": bool(jax.config.values.get("jax_enable_x64")),
        "jax_cpu_enable_async_dispatch": bool(
            jax.config.values.get("jax_cpu_enable_async_dispatch", True)),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # the allocator's settings: at N >= 1e6 fresh buffers' page faults are in the times
        "malloc_env": {k: v for k, v in os.environ.items()
                       if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD")},
        "numpy": np.__version__,
        "fusedlp_commit": _git_commit(),
        "load_average_1_5_15min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if jax.default_backend() != "cpu":
        info["accelerator"] = _accelerator_info()
    try:
        import numba

        info["numba"] = numba.__version__
        info["numba_svml"] = bool(numba.config.USING_SVML)
    except ImportError:  # pragma: no cover - numba is a bench dependency
        info["numba"] = None
    return info


def _accelerator_info() -> dict:
    """The default device's kind, driver and CUDA versions, and jax's plugin versions."""
    import subprocess
    from importlib import metadata

    dev = jax.devices()[0]
    info = {"device_kind": getattr(dev, "device_kind", str(dev)), "platform": dev.platform,
            "device_count": jax.device_count()}
    for name in ("jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin",
                 "jax-cuda12-pjrt"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip()
        info["nvidia_smi"] = smi
        head = subprocess.run(["nvidia-smi"], capture_output=True, text=True,
                              timeout=30).stdout
        found = re.search(r"CUDA Version:\s*([\d.]+)", head)
        info["cuda_version_of_driver"] = found.group(1) if found else None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


# --------------------------------------------------------------------------- layouts


def add_layout_argument(p, help_prefix: str = "") -> None:
    """``--layout``: which of fusedlp's layouts the kernels use (fusedlp._xla.LAYOUT)."""
    p.add_argument("--layout", choices=("auto", "cpu", "plain"), default="auto",
                   help=f"{help_prefix}the kernels' layouts: chosen by the backend (auto), "
                        "XLA:CPU's (cpu) or the exact pass alone (plain)")


def use_layout(choice: str) -> str:
    """Sets fusedlp's layouts from a ``--layout`` value, before anything is traced; returns
    the ones in use, "cpu" or "plain"."""
    from fusedlp import _xla

    _xla.LAYOUT = None if choice == "auto" else choice
    return "cpu" if _xla.cpu_layouts() else "plain"


# --------------------------------------------------------------------------- compile


def aot_compile(fn: Callable, *args) -> tuple[Callable, float, float]:
    """Lower and compile ``jax.jit(fn)`` for ``args``; return ``(jitted, lower_s, compile_s)``.

    The returned callable is the jitted function itself (what a user calls): JAX reuses the
    ahead-of-time compilation for it, so its first call is already warm.
    """
    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    return jitted, t1 - t0, t2 - t1


def program_text(fn: Callable, *args) -> str:
    """The optimized HLO of ``jax.jit(fn)`` for ``args``, without source metadata and with
    instructions renamed in order of appearance (XLA names them from the traced ops, which
    differ between equal programs): two callables with equal texts compile to the same
    program (an A/A pair for timing)."""
    import re

    text = jax.jit(fn).lower(*args).compile().as_text()
    keep = [re.sub(r", metadata=\{[^}]*\}", "", line) for line in text.splitlines()
            if line.lstrip().startswith(("%", "ROOT", "ENTRY", "}"))]
    names: dict[str, str] = {}

    def canonical(m):
        return "%" + names.setdefault(m.group(1), f"i{len(names)}")

    return "\n".join(re.sub(r"%([\w.\-]+)", canonical, line) for line in keep)


# --------------------------------------------------------------------------- timing


@dataclass
class Stats:
    """Per-call wall times of one variant, in seconds."""

    median: float
    min: float
    q1: float
    q3: float
    mean: float
    repeats: int
    total: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def as_dict(self) -> dict:
        d = asdict(self)
        d["iqr"] = self.iqr
        return d

    @classmethod
    def of(cls, samples) -> Stats:
        a = np.asarray(samples, dtype=float)
        q1, med, q3 = np.percentile(a, [25, 50, 75])
        return cls(float(med), float(a.min()), float(q1), float(q3), float(a.mean()),
                   int(a.size), float(a.sum()))


def _timed_once(call: Callable[[], object], block: bool) -> float:
    t0 = time.perf_counter()
    out = call()
    if block:
        jax.block_until_ready(out)
    return time.perf_counter() - t0


def _has_jax_array(out: object) -> bool:
    """Whether ``out`` holds a jax Array, whose computation may still be running."""
    return any(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(out))


def time_interleaved(
    calls: Mapping[str, Callable[[], object]],
    *,
    min_repeats: int = 7,
    min_total: float = 0.2,
    max_repeats: int = 20_000,
    max_total: float | None = None,
    warmup: int = 1,
    collect: float | None = None,
) -> dict[str, Stats]:
    """Time several zero-argument callables round-robin; return per-call :class:`Stats`.

    Adaptive: a variant keeps being called until it has at least ``min_repeats`` samples
    and ``min_total`` seconds of timed calls, or until it hits ``max_repeats`` samples or
    (with at least ``min_repeats`` samples) ``max_total`` seconds. Each round calls every
    variant that still needs samples once, in a fresh random order (seeded), so the variants
    share the machine's noisy phases and none keeps a fixed place in the round: on XLA:CPU a
    call's time at N ~ 1e5 was seen to depend 2-3x on which call ran before it (the first
    and last of four fixed-order variants slow, the middle two fast, whatever they were).
    The garbage collector is off while timing, as in :mod:`timeit`. With ``collect`` (in
    seconds) it also runs, untimed, after a call that ends that many seconds of timed calls
    since it last ran: for variants that leave cyclic garbage (a loop of statsmodels fits),
    which with the collector off piles up over the rounds and slows whatever runs next
    (docs/performance.md, "Where fusedlp does not win"). Not after every call: a call of
    a millisecond right after a collection runs with cold caches.

    A timed call ends in ``jax.block_until_ready`` if the variant returns jax Arrays; a
    variant that returns none (a numba loop's float and NumPy array) is already done when it
    returns, and is not charged the ~1.5 us that walking its output in
    ``block_until_ready`` costs.
    """
    names = list(calls)
    block = {}
    for name in names:
        for _ in range(max(warmup, 1)):
            out = calls[name]()
            jax.block_until_ready(out)
        block[name] = _has_jax_array(out)
        del out
    samples: dict[str, list[float]] = {name: [] for name in names}
    spent = dict.fromkeys(names, 0.0)

    def needs(name: str) -> bool:
        k = len(samples[name])
        if k < min_repeats:
            return True
        if k >= max_repeats or (max_total is not None and spent[name] >= max_total):
            return False
        return spent[name] < min_total

    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    order = np.random.default_rng(0)
    since_collect = 0.0
    try:
        active = names
        while active:
            for name in order.permutation(active):
                t = _timed_once(calls[name], block[name])
                since_collect += t
                if collect is not None and since_collect >= collect:
                    gc.collect()
                    since_collect = 0.0
                samples[name].append(t)
                spent[name] += t
            active = [name for name in names if needs(name)]
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: Stats.of(samples[name]) for name in names}


# --------------------------------------------------------------------------- formatting


def fmt_sig(x: float, sig: int = 3) -> str:
    """``x`` to ``sig`` significant figures, plain notation (no exponent below 1e7)."""
    if x is None or not math.isfinite(x):
        return "—"
    if x == 0:
        return "0"
    mag = math.floor(math.log10(abs(x)))
    if abs(round(x, sig - 1 - mag)) >= 10.0 ** (mag + 1):  # 9.996 -> 10.0: one more digit
        mag += 1
    digits = sig - 1 - mag
    rounded = round(x, digits)
    if digits <= 0:
        return f"{int(rounded):d}"
    return f"{rounded:.{digits}f}"


def fmt_us(seconds: float | None) -> str:
    """Seconds as microseconds, 3 significant figures."""
    return "—" if seconds is None else fmt_sig(seconds * 1e6, 3)


def fmt_ratio(r: float | None) -> str:
    return "—" if r is None or not math.isfinite(r) else fmt_sig(r, 3)


def targets_md(targets: list[dict], heading: str = "Targets (this run)") -> str:
    """A benchmark's acceptance targets as a markdown table (``met`` None: a measurement)."""
    if not targets:
        return ""
    lines = [f"### {heading}\n", "| target | met | measured |", "|---|:-:|---|"]
    for t in targets:
        met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['target']} | {met} | {t['detail']} |")
    return "\n".join(lines) + "\n"


def write_json(path: str, doc: dict, wall: float) -> None:
    """Write a benchmark's results with the wall time and the load average at the end."""
    import json

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    doc = {**doc, "wall_s": wall,
           "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1)
