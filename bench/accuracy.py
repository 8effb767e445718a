"""accuracy: worst error of value and gradient over the mpmath grid, fusedlp vs jax.scipy vs scipy.

For every kernel and dtype (float64, float32), over the grid of the accuracy sweep (the
mpmath reference table cached in ``tests/data/accuracy_reference.json.gz``, written by
``python tests/accuracy_reference.py``; nothing is recomputed here), side by side:

* **fusedlp** — the public kernel, value and ``jax.value_and_grad`` on single elements;
* **jax.scipy** — ``jax.scipy.stats``' log-density in the same parametrisation (e.g.
  ``nbinom.logpmf(k, phi, phi / (mu + phi))``, ``poisson.logpmf(k, exp(eta))``), gradient
  by autodiff; none for eam_energy;
* **scipy** — ``scipy.stats`` at the same (dtype-rounded) inputs, value only (its result
  cast to the dtype).

Two tables: the worst plain relative error ``|got - q| / |q|`` (gradient: over all
partials; points where q = 0 are left out), and the worst error in units of
``eps * max(1, cond)``, the test's measure
(``tests/accuracy_table.py``; ``tests/test_accuracy.py`` requires <= 8). A NaN, a wrong
infinity or a finite number where the true value overflows the dtype counts as ``inf``.
The grid and the reference do not depend on the machine; neither do these numbers (up to
the libm of the CPU). JSON: ``--json`` (default ``bench/results/accuracy.json``), with the
worst point of every entry.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import time

import numpy as np

from bench._timing import add_json_argument

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBRARIES = ("fusedlp", "jax.scipy", "scipy")


def _table_module():
    """tests/accuracy_table.py (the table and the error measure the sweep test uses)."""
    spec = importlib.util.spec_from_file_location("accuracy_table",
                                                  ROOT / "tests" / "accuracy_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _densities(stats, exp, expit):
    """The kernels' densities in a scipy.stats-like module (their logpdf/logpmf)."""
    return {
        "normal_lpdf": stats.norm.logpdf,
        "poisson_lpmf": stats.poisson.logpmf,
        "poisson_log_lpmf": lambda k, eta: stats.poisson.logpmf(k, exp(eta)),
        "negative_binomial_lpmf": lambda k, mu, phi: stats.nbinom.logpmf(k, phi,
                                                                         phi / (mu + phi)),
        "student_t_lpdf": stats.t.logpdf,
        "gamma_lpdf": lambda x, a, b: stats.gamma.logpdf(x, a, scale=1.0 / b),
        "bernoulli_logit_lpmf": lambda y, eta: stats.bernoulli.logpmf(y, expit(eta)),
        "binomial_logit_lpmf": lambda k, n, eta: stats.binom.logpmf(k, n, expit(eta)),
    }


def _jax_scipy(kernel):
    import jax
    import jax.numpy as jnp
    import jax.scipy.stats as jst

    return _densities(jst, jnp.exp, jax.nn.sigmoid).get(kernel)


def _scipy(kernel):
    import scipy.special as sps
    import scipy.stats as st

    return _densities(st, np.exp, sps.expit).get(kernel)


def _worst(at, table, dtype, got, quantity_refs):
    """Worst relative error and worst ratio over (got, ref, sens, mask) quantities, with the
    point, quantity, got and expected of the worst ratio."""
    rel_max, ratio_max, where = 0.0, 0.0, None
    for name, g, ref, sens, mask in quantity_refs(got):
        # plain relative error: the ratio without the condition number, where q != 0
        plain = at.ratios(g, ref, np.zeros_like(ref), dtype) * np.finfo(np.dtype(dtype)).eps
        rel = np.where(mask & (ref != 0), plain, 0.0)
        ratio = np.where(mask, at.ratios(g, ref, sens, dtype), 0.0)
        rel_max = max(rel_max, float(rel.max(initial=0.0)))
        i = int(np.argmax(ratio))
        if where is None or ratio[i] > ratio_max:
            ratio_max = float(ratio[i])
            where = {"quantity": name, "got": float(g[i]), "expected": float(ref[i]),
                     "point": dict(zip(table["args"], table["inputs"][i].tolist()))}
    return {"rel": rel_max, "ratio": ratio_max, "worst": where}


def measure(at, kernel, dtype) -> dict:
    """The worst errors of every library for one kernel and dtype."""
    table = at.load()[f"{kernel}/{dtype}"]
    judged = at.judged_partials(table)
    everywhere = np.ones(len(table["value"]), bool)

    def values(v):
        return [("value", v, table["value"], table["sens"][:, 0], everywhere)]

    def partials(p):
        return [(d, p[:, j], table["partials"][:, j], table["sens"][:, 1 + j], judged)
                for j, d in enumerate(table["diff"])]

    row = {"kernel": kernel, "dtype": dtype, "points": len(table["value"])}
    for lib, fn in (("fusedlp", at.fusedlp_kernel(kernel)), ("jax.scipy", _jax_scipy(kernel))):
        if fn is None:
            row[lib] = None
            continue
        v, p = at.evaluate(fn, table, dtype)
        row[lib] = {"value": _worst(at, table, dtype, v, values),
                    "grad": _worst(at, table, dtype, p, partials)}
    fn = _scipy(kernel)
    if fn is None:
        row["scipy"] = None
    else:
        cols = [table["inputs"][:, i].astype(dtype) for i in range(len(table["args"]))]
        with np.errstate(all="ignore"):
            v = np.asarray(fn(*cols)).astype(dtype).astype(np.float64)
        row["scipy"] = {"value": _worst(at, table, dtype, v, values), "grad": None}
    return row


def _fmt(entry, part, key):
    if entry is None or entry[part] is None:
        return "—"
    x = entry[part][key]
    return "inf" if not np.isfinite(x) else ("0" if x == 0 else f"{x:.2g}")


def markdown(rows, key, title) -> str:
    head = " | ".join(f"{lib} value | {lib} grad" for lib in LIBRARIES)
    lines = [f"### {title}\n", f"| kernel | dtype | points | {head} |",
             "|---|---|--:|" + "--:|" * (2 * len(LIBRARIES))]
    for r in rows:
        cells = " | ".join(f"{_fmt(r[lib], 'value', key)} | {_fmt(r[lib], 'grad', key)}"
                           for lib in LIBRARIES)
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['points']} | {cells} |")
    return "\n".join(lines) + "\n"


def add_arguments(p) -> None:
    add_json_argument(p, "accuracy.json")
    p.add_argument("--kernels", default=None,
                   help="comma-separated subset of the kernels (default: all)")


def main(args) -> int:
    import jax

    from bench import _timing

    jax.config.update("jax_enable_x64", True)
    at = _table_module()
    kernels = at.kernels()
    if args.kernels:
        keys = [k.strip() for k in args.kernels.split(",") if k.strip()]
        unknown = sorted(set(keys) - set(kernels))
        if unknown:
            raise SystemExit(f"unknown kernel(s) {unknown}; choose from {','.join(kernels)}")
        kernels = [k for k in kernels if k in keys]
    machine = _timing.machine_info()
    t_start = time.perf_counter()
    rows = []
    for kernel in kernels:
        for dtype in at.DTYPES:
            rows.append(measure(at, kernel, dtype))
            print(f"  {kernel:24s} {dtype}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t_start
    print("## Accuracy over the parameter grid (reference: mpmath)\n")
    print(f"{machine['date']}: jax/jaxlib {machine['jax']}/{machine['jaxlib']} "
          f"({machine['backend']}), fusedlp {machine.get('fusedlp_commit')}. "
          f"Grid and references: tests/data/accuracy_reference.json.gz.\n")
    print(markdown(rows, "rel", "Worst relative error |got - q| / |q|"))
    print(markdown(rows, "ratio", "Worst error in units of eps * max(1, cond) "
                                  "(tests/test_accuracy.py: <= 8)"))
    if args.json:
        _timing.write_json(args.json, {"benchmark": "accuracy", "machine": machine,
                                       "rows": rows}, wall)
        print(f"# wrote {args.json} ({wall:.0f} s)", file=sys.stderr)
    return 0
