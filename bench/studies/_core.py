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

FONT = 9  # legend and tick labels: readable at the notebook's width
KIND_STYLE = {"value": "-", "gradient": "-", "jacobian": "-", "value_and_gradient": "--"}


def _coincide(a: dict, b: dict, rtol: float = 0.10) -> bool:
    """Two lines lie on top of each other: within ``rtol`` at every n both have."""
    common = [n for n in a if n in b]
    return bool(common) and all(abs(a[n] / b[n] - 1) <= rtol for n in common)


def plot(result: dict, ax, variants: Sequence[str], title: str = ""):
    """Log-log time against n for the named variants (at most about five, so the eye can
    follow them), with the jit call floor as a grey reference line."""
    # fusedlp (or the study's fused rule) in reds with large hollow markers, so that a line
    # lying exactly on another still shows as rings around its points; the value black; the
    # rest in other colours and marker shapes; value-and-gradient dashed; the floor grey
    others = iter(zip(["tab:blue", "tab:green", "tab:purple", "tab:olive", "tab:cyan"],
                      ["s", "^", "D", "v", "P"]))
    fused = iter(["tab:red", "darkred", "tab:orange"])
    def times(name):
        return {r["n"]: r["median_s"] for r in result["rows"]
                if r["variant"] == name and r["median_s"] is not None}

    fused_names = [v for v in variants if times(v) and "fused" in
                   next(r["label"] for r in result["rows"] if r["variant"] == v)]
    for name in [*variants, "call_floor"]:
        rs = [r for r in result["rows"] if r["variant"] == name and r["median_s"] is not None]
        if not rs:
            continue
        label, kind = rs[0]["label"], rs[0]["kind"]
        if name not in fused_names and any(_coincide(times(name), times(f)) for f in fused_names):
            label += " (under the red line: within 10 %)"
        style = dict(ls=KIND_STYLE.get(kind, "-"), lw=1.5, marker="o", markersize=4)
        if name == "call_floor":
            label = "jit call floor (a call that does no work)"
            style.update(ls=":", color="0.5", markersize=3)
        elif "fused" in label:
            style.update(color=next(fused), lw=2.0, markersize=9, markerfacecolor="none",
                         markeredgewidth=1.8)
        elif kind == "value" and name in ("value", "s_value"):
            style.update(color="black")
        else:
            color, marker = next(others)
            style.update(color=color, marker=marker, markersize=5)
        ax.plot([r["n"] for r in rs], [r["median_s"] * 1e6 for r in rs], label=label, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n", fontsize=FONT + 1)
    ax.set_ylabel("median time per call (µs)", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT)
    ax.set_title(title, fontsize=FONT + 2)
    ax.grid(True, which="major", alpha=0.3)
    # below the axes, where it covers no data
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(0.0, -0.14), frameon=False)
    return ax


def plot_ratios(comparison: Sequence[dict], ax):
    """Bars: the write-up's ratio and ours, side by side, for each row of a comparison."""
    rows = [c for c in comparison if c["seed_ratio"] is not None]
    ypos = np.arange(len(rows))
    ax.barh(ypos - 0.2, [c["seed_ratio"] for c in rows], 0.4, color="tab:gray",
            label="in the write-up (its machine, mostly Julia)")
    ax.barh(ypos + 0.2, [c["our_ratio"] for c in rows], 0.4, color="tab:red",
            label="here (JAX / fusedlp)")
    ax.set_yticks(ypos, [f"{c['seed']}  (n = {c['n']:,})" for c in rows], fontsize=FONT)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="k", lw=1.0)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_title("The write-up's ratios beside ours (log scale). Each bar is a time divided\n"
                 "by the time of the reference named after the '/': 1 (black line) = as fast "
                 "as that reference, below 1 = faster", fontsize=FONT + 1, loc="right")
    ax.legend(fontsize=FONT, loc="upper left", bbox_to_anchor=(0.0, -0.09), ncol=2,
              frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def figure(result: dict, comparison: Sequence[dict] | None = None,
           panels: Sequence[tuple[str, Sequence[str]]] = ()):
    """One panel of time against n per ``(title, variants)`` in ``panels`` (side by side),
    and below them, given a comparison, the write-up's ratios against ours."""
    import matplotlib.pyplot as plt

    k = max(len(panels), 1)
    n_bars = len([c for c in comparison or () if c["seed_ratio"] is not None])
    heights = [6.2] + ([2.0 + 0.38 * n_bars] if comparison else [])
    fig = plt.figure(figsize=(max(5.2 * k, 10.4), sum(heights)), layout="constrained")
    # separate subfigures: the bar chart's long labels must not squeeze the panels above
    subs = fig.subfigures(len(heights), 1, height_ratios=heights)
    top = subs[0] if comparison else subs
    axes = top.subplots(1, k, squeeze=False)[0]
    for ax, (title, variants) in zip(axes, panels):
        plot(result, ax, variants, title)
    if comparison:
        plot_ratios(comparison, subs[1].subplots())
    fig.suptitle(result["title"], fontsize=FONT + 3)
    return fig


def save_plot(result: dict, path: str, comparison: Sequence[dict] | None = None,
              panels: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig = figure(result, comparison, panels)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def us(x: float | None) -> str:
    return "—" if x is None or not math.isfinite(x) else fmt_us(x)
