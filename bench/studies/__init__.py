"""The five studies: public write-ups on the cost of gradients, reproduced with JAX and fusedlp.

Each study answers one write-up (a gist, an issue or a forum thread, named in its module's
``SOURCE``). ``python -m bench`` runs them all and prints one markdown table per study, the
write-up's ratios beside ours, and a headline table. Each study is a module with
``run(quick) -> dict`` (JSON-ready), ``comparison(result)`` and, where it has more to show,
``extra_tables(result)``; the notebooks in ``notebooks/`` call the same functions.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType

from bench._timing import add_json_argument, fmt_ratio
from bench.studies import broadcast, eam, jacobian, normal_ad, poisson
from bench.studies._core import comparison_table, header, md_table, save_plot, table, us

STUDIES: dict[str, ModuleType] = {
    m.NAME: m for m in (normal_ad, jacobian, broadcast, eam, poisson)
}
QUICK_ENV = "FUSEDLP_QUICK"


def quick_from_env() -> bool:
    """Quick mode for notebooks: ``FUSEDLP_QUICK=1`` (what CI sets)."""
    return os.environ.get(QUICK_ENV, "").strip().lower() in ("1", "true", "yes")


def setup() -> dict:
    """float64 on (the studies are float64, as the write-ups' are), JAX's asynchronous CPU dispatch
    off (as in ``python -m bench kernels``); the machine record.

    With asynchronous dispatch on (JAX's default), a call whose compiled program XLA deems
    large enough runs on a worker thread and the caller waits for it: on this 2-core machine
    that hand-off costs 10-30 µs from about a thousand elements up, which would swamp the
    differences these studies look at. Must run before JAX's CPU backend starts.
    """
    import jax

    from bench import _timing

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    return _timing.machine_info()


TABLE_NOTE = (
    "Each row is one way of computing the value or a gradient at size n, checked against a "
    "reference before anything is timed. median µs: the median time per call after "
    "compilation; IQR µs: the inter-quartile range of those calls; × value: the time as a "
    "multiple of the value's at the same n (below 1: cheaper than the value); compile ms: "
    "the compile time, not part of the median; jit: compiled with jax.jit (no: run operation "
    "by operation, or a numba function).")
COMPARISON_NOTE = (
    "Each row puts a ratio the write-up reports (measured on its author's machine, mostly in "
    "Julia) beside the matching ratio measured here. The machines differ, so ratios are "
    "compared, not times.")


def study_markdown(result: dict) -> str:
    mod = STUDIES[result["study"]]
    parts = [f"## {result['title']}", "",
             (f"This study measures {mod.MEASURES}. It answers {result['source']}. "
              f"Study `{result['study']}`{' (quick mode)' if result['quick'] else ''}: "
              f"{len(result['checks'])} correctness checks passed before timing."), "",
             TABLE_NOTE, "", table(result)]
    for title, md in getattr(mod, "extra_tables", lambda r: [])(result):
        parts += ["", f"**{title}**", "", md]
    parts += ["", "**Ratios: the write-up's against ours**", "", COMPARISON_NOTE, "",
              comparison_table(mod.comparison(result))]
    return "\n".join(parts)


INTRO = (
    "Each study reruns, with JAX and fusedlp, a public write-up (a gist, an issue or a forum "
    "thread, most in Julia) about the cost of gradients of a simple log-density or potential. "
    "Every table is preceded by what it measures and which write-up it answers. Run "
    "`python -m bench --help` for the other benchmarks.")
HEADLINE_NOTE = (
    "One row per study and size: the value's time, the fastest automatic-differentiation "
    "gradient and fusedlp's gradient (gradient alone, as the write-ups time it), and each "
    "gradient as a multiple of the value (below 1: the gradient costs less than the value).")


def headline_table(results: list[dict]) -> str:
    rows = []
    for r in results:
        for h in r["headline"]:
            rows.append([
                r["study"], f"{h['n']:,}", us(h["value_s"]),
                f"{us(h['best_ad_s'])} ({h['best_ad']})",
                _fused_cell(h),
                fmt_ratio(h["best_ad_over_value"]),
                fmt_ratio(h["fused_over_value"]) if h["fused_over_value"] else "—",
            ])
    return md_table(["study", "n", "value µs", "best AD gradient µs",
                     "fused gradient µs (fusedlp unless noted)", "best AD / value",
                     "fused / value"], rows, "lrrlrrr")


def _fused_cell(h: dict) -> str:
    """The fused gradient's time; a variant that is not a fusedlp kernel (the broadcast
    study's Σ exp has none: its fused rule is the study's own custom_vjp) says so."""
    if not h["fused_s"]:
        return "— (no fusedlp kernel)"
    label = h.get("fused") or ""
    note = "" if label.startswith("fusedlp") else f" ({label}; no fusedlp kernel)"
    return us(h["fused_s"]) + note


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="small sizes and few repeats: seconds per study (what CI runs)")
    p.add_argument("--study", action="append", metavar="NAME",
                   help=f"run only this study (repeatable; one of {', '.join(STUDIES)})")
    add_json_argument(p, "studies.json",
                      help="write every figure, check and the machine record here")
    p.add_argument("--plots", metavar="DIR", help="write one PNG per study (log-log time vs n)")


def _log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


def main(args) -> int:
    names = args.study or list(STUDIES)
    unknown = [n for n in names if n not in STUDIES]
    if unknown:
        raise SystemExit(f"unknown study {unknown}; choose from {', '.join(STUDIES)}")
    machine = setup()
    print("# fusedlp: five studies of what gradients cost\n")
    print(INTRO + "\n")
    print(header(machine) + "\n")
    t0 = time.perf_counter()
    results = []
    for name in names:
        t = time.perf_counter()
        _log(f"# study {name}{' (quick)' if args.quick else ''} ...")
        res = STUDIES[name].run(quick=args.quick)
        results.append(res)
        print(study_markdown(res) + "\n", flush=True)
        _log(f"#   {name}: {time.perf_counter() - t:.1f} s")
        if args.plots:
            os.makedirs(args.plots, exist_ok=True)
            path = os.path.join(args.plots, f"{name}.png")
            save_plot(res, path, STUDIES[name].comparison(res), STUDIES[name].PLOT_PANELS)
            _log(f"#   wrote {path}")
    wall = time.perf_counter() - t0
    print("## Headline: each study at its write-up's n, and at n = 10⁶ where it has one\n")
    print(HEADLINE_NOTE + "\n")
    print(headline_table(results))
    print(f"\nWall time {wall:.0f} s{' (quick mode)' if args.quick else ''}.")
    if args.json:
        from bench._timing import write_json

        write_json(args.json, {"benchmark": "fusedlp studies", "machine": machine,
                               "quick": args.quick, "results": results}, wall)
        _log(f"# wrote {args.json}")
    return 0

