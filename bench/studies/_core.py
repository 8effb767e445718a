"""What every study shares: variants, the correctness gate, timing, tables and plots.

A study builds, for each size n, a list of :class:`Variant` (one way of computing the value or
the gradient), checks that every gradient variant agrees with the fused kernel (or the study's
reference) *before* anything is timed, then times all variants of one n round-robin with
:func:`bench._timing.time_interleaved` (median of repeated calls after compilation; compile
time is measured apart, by ahead-of-time lowering and compiling).

A study's result is a plain dict (JSON-ready): ``rows`` holds one entry per (n, variant) with
the median and its spread, the compile time and the ratio to the value at the same n.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
import numpy as np

from bench import _timing
from bench._timing import fmt_ratio, fmt_sig, fmt_us


def floor_variant(x) -> Variant:
    """A jitted call that does no work on ``x`` (returns its first element): the fixed cost of
    calling any compiled JAX function from Python, which small-n timings cannot go below."""
    return Variant("call_floor", "jit call floor (x[0])", "overhead", lambda x: x.ravel()[0],
                   (x,), note="dispatch cost, no work")


@dataclass
class Variant:
    """One way of computing something, timed as ``fn(*args)``.

    ``jit=True``: ``fn`` is compiled ahead of time with ``jax.jit`` (compile time recorded);
    ``jit=False``: ``fn`` is called as is (op-by-op JAX, or a numba function, whose first
    call compiles it: that call's time is recorded as its compile time).
    ``ad`` marks the automatic-differentiation variants the headline's "best AD" is taken
    from (not finite differences, not hand-written or fused code).
    """

    name: str
    label: str
    kind: str  # value | gradient | value_and_gradient | jacobian | overhead; the first
    #            "value" variant of a Study.time call is the denominator of its ratios
    fn: Callable
    args: tuple
    jit: bool = True
    ad: bool = False
    note: str = ""


@dataclass
class Config:
    quick: bool
    min_repeats: int = 20
    min_total: float = 0.3
    max_total: float = 1.5

    @classmethod
    def make(cls, quick: bool) -> Config:
        if quick:
            return cls(quick=True, min_repeats=5, min_total=0.01, max_total=0.05)
        return cls(quick=False)


@dataclass
class Study:
    """Accumulates one study's rows; ``result()`` is the JSON-ready dict."""

    name: str
    title: str
    source: str  # the public write-up the study answers, named and described
    cfg: Config
    rows: list = field(default_factory=list)
    checks: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    _compiled: dict = field(default_factory=dict, repr=False)
    t0: float = field(default_factory=time.perf_counter)

    # ------------------------------------------------------------------ correctness

    def check(self, n: int, what: str, got, ref, *, rtol: float = 1e-10, atol: float = 0.0):
        """Fail loudly unless ``got`` matches ``ref`` (before any timing of that n)."""
        got = np.asarray(got, dtype=complex if np.iscomplexobj(got) else float)
        ref = np.asarray(ref, dtype=float)
        if got.shape != ref.shape:
            raise AssertionError(f"{self.name} n={n}: {what}: shape {got.shape} != {ref.shape}")
        err = float(np.max(np.abs(got - ref) / (atol + rtol * np.maximum(np.abs(ref), 1.0)),
                        initial=0.0))
        rel = float(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300), initial=0.0))
        self.checks.append({"n": n, "what": what, "max_rel_err": rel, "rtol": rtol,
                            "atol": atol})
        if not err <= 1.0:  # also catches NaN
            raise AssertionError(
                f"{self.name} n={n}: {what} disagrees with the reference: max relative error "
                f"{rel:.3g} (rtol {rtol:g}, atol {atol:g})")

    # ------------------------------------------------------------------ timing

    def prepare(self, n: int, variants: Sequence[Variant]) -> dict:
        """Compile every variant (timing the compilation) and return its outputs by name.

        Jitted variants are lowered and compiled ahead of time; others are called once, and
        that first call (numba's compilation, eager JAX's per-primitive caches) is recorded
        as their compile time. Call this before :meth:`check` and :meth:`time`.
        """
        outs = {}
        for v in variants:
            if v.jit:
                jitted, lower_s, comp_s = _timing.aot_compile(v.fn, *v.args)
                self._compiled[(n, v.name)] = (jitted, lower_s + comp_s)
                outs[v.name] = jax.block_until_ready(jitted(*v.args))
            else:
                t0 = time.perf_counter()
                outs[v.name] = jax.block_until_ready(v.fn(*v.args))
                self._compiled[(n, v.name)] = (v.fn, time.perf_counter() - t0)
        return outs

    def time(self, n: int, variants: Sequence[Variant], *, per: int = 1) -> None:
        """Time every (prepared) variant of size ``n`` round-robin; record rows.

        ``per`` divides every time (a batched call of ``per`` evaluations is reported per
        evaluation).
        """
        calls, compile_s = {}, {}
        for v in variants:
            if (n, v.name) not in self._compiled:
                self.prepare(n, [v])
            fn, compile_s[v.name] = self._compiled[(n, v.name)]
            calls[v.name] = (lambda f=fn, a=v.args: f(*a))
        stats = _timing.time_interleaved(
            calls, min_repeats=self.cfg.min_repeats, min_total=self.cfg.min_total,
            max_total=self.cfg.max_total)
        value = [v for v in variants if v.kind == "value"]
        base = stats[value[0].name].median if value else None
        for v in variants:
            s = stats[v.name]
            self.rows.append({
                "n": n, "variant": v.name, "label": v.label, "kind": v.kind, "jit": v.jit,
                "ad": v.ad, "note": v.note, "per": per,
                "median_s": s.median / per, "min_s": s.min / per, "iqr_s": s.iqr / per,
                "repeats": s.repeats, "compile_s": compile_s[v.name],
                "ratio_to_value": (s.median / base) if base else None,
            })

    def skip(self, n: int, name: str, label: str, kind: str, why: str, *, ad=False) -> None:
        """A variant not run at this n (the reason shows in the table)."""
        self.rows.append({"n": n, "variant": name, "label": label, "kind": kind, "jit": None,
                          "ad": ad, "note": why, "per": 1, "median_s": None, "min_s": None,
                          "iqr_s": None, "repeats": 0, "compile_s": None,
                          "ratio_to_value": None})

    # ------------------------------------------------------------------ result

    def result(self, *, seed_figures: dict, headline: dict | None = None) -> dict:
        return {
            "study": self.name, "title": self.title, "source": self.source,
            "quick": self.cfg.quick, "rows": self.rows, "checks": self.checks,
            "notes": self.notes, "seed_figures": seed_figures, "headline": headline,
            "extra": self.extra, "wall_s": time.perf_counter() - self.t0,
        }


# ---------------------------------------------------------------------- lookups


def row(result: dict, n: int, variant: str) -> dict:
    for r in result["rows"]:
        if r["n"] == n and r["variant"] == variant:
            return r
    raise KeyError(f"{result['study']}: no row n={n} variant={variant}")


def median(result: dict, n: int, variant: str) -> float:
    return row(result, n, variant)["median_s"]


def sizes(result: dict) -> list[int]:
    return sorted({r["n"] for r in result["rows"]})


def headline_row(result: dict, n: int, value: str, fused: str | None,
                 kinds: Sequence[str] = ("gradient",), among: Sequence[str] | None = None,
                 ) -> dict:
    """The README headline entry: value, best AD gradient, fused gradient, ratios.

    "Best AD" is the fastest row at ``n`` marked ``ad`` whose kind is in ``kinds`` (and whose
    variant is in ``among``, if given).
    """
    ad = [r for r in result["rows"] if r["n"] == n and r["ad"] and r["kind"] in kinds
          and r["median_s"] is not None and (among is None or r["variant"] in among)]
    best = min(ad, key=lambda r: r["median_s"])
    v = median(result, n, value)
    f = median(result, n, fused) if fused else None
    return {"n": n, "value_s": v, "best_ad": best["label"], "best_ad_s": best["median_s"],
            "fused": row(result, n, fused)["label"] if fused else None, "fused_s": f,
            "best_ad_over_value": best["median_s"] / v,
            "fused_over_value": (f / v) if f else None}


# ---------------------------------------------------------------------- markdown


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def table(result: dict) -> str:
    """One markdown table: rows grouped by n, in the order the study timed them."""
    body = []
    for r in result["rows"]:
        per = f" (per eval. of {r['per']})" if r["per"] > 1 else ""
        body.append([
            f"{r['n']:,}", r["label"] + per, r["kind"].replace("_", " "),
            "jit" if r["jit"] else ("—" if r["jit"] is None else "no"),
            fmt_us(r["median_s"]),
            "—" if r["iqr_s"] is None else fmt_us(r["iqr_s"]),
            fmt_ratio(r["ratio_to_value"]),
            "—" if r["compile_s"] is None else fmt_sig(r["compile_s"] * 1e3, 3),
            r["note"],
        ])
    return md_table(["n", "variant", "computes", "jit", "median µs", "IQR µs", "× value",
                "compile ms", "note"], body, "rlllrrrrl")


def comparison_table(rows: Sequence[dict]) -> str:
    """The write-up's ratios beside ours (rows from a study's ``comparison()``)."""
    body = []
    for c in rows:
        seed = c.get("seed_words") or fmt_ratio(c["seed_ratio"])
        body.append([f"{c['n']:,}", c["seed"], seed, c["ours"], fmt_ratio(c["our_ratio"])])
    return md_table(["n", "in the write-up", "its ratio", "here", "our ratio"], body, "rlrlr")


def header(machine: dict) -> str:
    return (f"Measured {machine['date'][:16]} on {machine['cpu_model']}, "
            f"{machine['cpu_count']} cores; jax/jaxlib {machine['jax']}/{machine['jaxlib']} "
            f"({machine['backend']}, devices {', '.join(machine['devices'])}), "
            f"numba {machine.get('numba')}; float64; JAX asynchronous CPU dispatch "
            f"{'on' if machine.get('jax_cpu_enable_async_dispatch') else 'off'}. Median per "
            "call after compilation; compile time (lower + compile, or a numba/eager first "
            "call) apart.")


# ---------------------------------------------------------------------- plots


def plot(result: dict, ax=None, *, kinds: Sequence[str] | None = None):
    """Log-log time against n, one line per variant (variants timed at one n are points)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    names = []
    for r in result["rows"]:
        if r["variant"] not in names:
            names.append(r["variant"])
    colors = plt.get_cmap("tab20").colors
    for i, name in enumerate(names):
        rs = [r for r in result["rows"] if r["variant"] == name and r["median_s"] is not None
              and (kinds is None or r["kind"] in kinds)]
        if not rs:
            continue
        ns = [r["n"] for r in rs]
        ts = [r["median_s"] * 1e6 for r in rs]
        style = "-o" if rs[0]["kind"] == "value" else ("--s" if not rs[0]["ad"] else "-^")
        per = f" (per eval., batch of {rs[0]['per']:,})" if rs[0]["per"] > 1 else ""
        ax.plot(ns, ts, style, label=rs[0]["label"] + per, markersize=4,
                color=colors[i % len(colors)])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n")
    ax.set_ylabel("median time per call (µs)")
    ax.set_title(result["title"], fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return ax


def plot_ratios(comparison: Sequence[dict], ax=None):
    """Bars: the seed's ratio and ours, side by side, for each row of a study's comparison."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    rows = [c for c in comparison if c["seed_ratio"] is not None]
    ypos = np.arange(len(rows))
    ax.barh(ypos - 0.2, [c["seed_ratio"] for c in rows], 0.4, label="seed")
    ax.barh(ypos + 0.2, [c["our_ratio"] for c in rows], 0.4, label="ours (JAX / fusedlp)")
    ax.set_yticks(ypos, [f"{c['seed']} (n={c['n']:,})" for c in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("ratio (log scale; 1 = as fast as the reference)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def figure(result: dict, comparison: Sequence[dict] | None = None):
    """Time against n (left) and, given a comparison, the seed's ratios against ours."""
    import matplotlib.pyplot as plt

    if comparison is None:
        fig, ax = plt.subplots(figsize=(10, 4.5), layout="constrained")
        plot(result, ax)
    else:
        fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 9), layout="constrained",
                                     gridspec_kw={"height_ratios": [1.2, 1]})
        plot(result, ax)
        plot_ratios(comparison, bx)
    return fig


def save_plot(result: dict, path: str, comparison: Sequence[dict] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig = figure(result, comparison)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def us(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else fmt_us(x)
