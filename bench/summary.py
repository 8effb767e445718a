"""Print the benchmark tables from saved results (JSON); times nothing.

``python -m bench summary [--results DIR]`` reads the JSON files the benchmarks write
(``studies.json``, ``kernels.json``, ``contexts.json``, ``hessian.json``, ``fuse.json``,
``fit.json``, ``sharding.json``, ``workloads.json``) from
``DIR`` and prints one markdown section per file found, each headed by the date, the machine
and the commit it was measured on. The documentation's performance page is this output for
the results committed in ``docs/results/``, so its numbers are the ones the code produced.
"""

from __future__ import annotations

import json
import os

from bench._timing import fmt_ratio, fmt_us, results_dir

DEFAULT_RESULTS = results_dir()
SIZES = (10**4, 10**6, 10**7)
# the order of the sections, and the file each one reads
SECTIONS = ("studies", "kernels", "contexts", "hessian", "fuse", "fit", "sharding",
            "workloads")
# the same benchmarks run on a GPU (docs/gpu.md), each in gpu_NAME.json; not in SECTIONS,
# which the CPU performance page shows whole
GPU_SECTIONS = ("gpu_throughput", "gpu_contexts", "gpu_hessian", "gpu_workloads")


def add_arguments(p) -> None:
    p.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR",
                   help="folder holding the benchmarks' JSON files (default: bench/results in a "
                        "clone, else fusedlp-bench-results, where the benchmarks write them; "
                        "docs/results holds the committed ones)")
    p.add_argument("--section", action="append", choices=SECTIONS + GPU_SECTIONS,
                   metavar="NAME", help="print only this section (repeatable; one of "
                                        f"{', '.join(SECTIONS + GPU_SECTIONS)})")


def machine_line(doc: dict) -> str:
    """Date, machine, software and commit of one saved run, in one sentence."""
    m = doc["machine"]
    load = m.get("load_average_1_5_15min")
    parts = [f"Measured {m['date'][:10]} on {m['cpu_model']} ({m['cpu_count']} cores, "
             f"{m['platform']})", f"jax {m['jax']} ({m['backend']})"]
    acc = m.get("accelerator")
    if acc:
        plugin = next((f"{k} {v}" for k, v in acc.items() if k.startswith("jax-cuda")), None)
        parts[0] = (f"Measured {m['date'][:10]} on an {acc['device_kind']} (nvidia-smi: "
                    f"{acc.get('nvidia_smi', 'n/a')}; driver's CUDA "
                    f"{acc.get('cuda_version_of_driver', 'n/a')}), host {m['cpu_model']} "
                    f"({m['cpu_count']} cores)")
        parts[1] += f", {plugin}" if plugin else ""
    if m.get("numba"):
        parts.append(f"numba {m['numba']}")
    if m.get("fusedlp_commit"):
        parts.append(f"fusedlp commit {m['fusedlp_commit']}")
    if load:
        parts.append(f"load average {load[0]:.2f} at the start")
    if doc.get("quick") or doc.get("config", {}).get("quick"):
        parts.append("**quick mode** (small sizes, few repeats)")
    return "; ".join(parts) + "."


def kernels_table(doc: dict, dtype: str = "float64") -> str:
    """Each hand-written kernel at N = 1e4, 1e6, 1e7: value, value-and-gradient, jax
    autodiff and the numba loop."""
    lines = [
        "| kernel | N | value µs | v&g µs | v&g / value | autodiff v&g µs | autodiff / fused "
        "| gradient alone: autodiff / fused | numba v&g µs | fused / numba |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["results"]:
        if r["dtype"] != dtype or r["n"] not in SIZES:
            continue
        v, q = r["variants"], r["ratios"]
        # normalized=False drops log k!: against the plain formula without it (equal work),
        # not jax.scipy.stats, which forms it for every element
        reduced = "normalized=False" in r["kernel"] and "plain" in r["baselines"]
        base = ("plain" if reduced else "stats" if "stats" in r["baselines"]
                else r["baselines"][0])
        decade = len(str(r["n"])) - 1
        lines.append(
            f"| `{r['kernel']}` | 10^{decade} | {fmt_us(v['fused.value']['median'])} "
            f"| {fmt_us(v['fused.vg']['median'])} | {fmt_ratio(q['fused_vg_over_value'])} "
            f"| {fmt_us(v[base + '.vg']['median'])} "
            f"| {fmt_ratio(q[base + '_vg_over_fused_vg'])} "
            f"| {fmt_ratio(v[base + '.grad']['median'] / v['fused.grad']['median'])} "
            f"| {fmt_us(v['numba.vg']['median'])} | {fmt_ratio(q['fused_vg_over_numba_vg'])} |")
    return "\n".join(lines)


def section(name: str, doc: dict) -> str:
    """One section's markdown: a heading, what is measured, the machine line, the table."""
    if name == "studies":
        from bench.studies import headline_table

        return "\n\n".join([
            "### The studies (`python -m bench`)",
            "Each study at the size its write-up used (and at n = 10⁶ where it has one): the "
            "value's time, the fastest automatic-differentiation gradient, fusedlp's gradient, "
            "and both gradients as a multiple of the value (below 1: the gradient is cheaper "
            "than the value). Gradient alone, as the write-ups time it.",
            machine_line(doc), headline_table(doc["results"])])
    if name == "kernels":
        return "\n\n".join([
            "### Hand-written kernels (`python -m bench kernels`)",
            "float64, median µs per call. v&g = value and gradient in one call; autodiff = "
            "`jax.value_and_grad` of the `jax.scipy.stats` log-density (the plain formula for "
            "EAM), jitted; numba = a single-threaded hand-written loop that allocates its "
            "gradient. autodiff / fused above 1: fusedlp is faster (for value and gradient, and "
            "for `jax.grad` alone); fused / numba below 1: fusedlp is faster. For the "
            "log-rate Poisson, autodiff differentiates `poisson.logpmf(k, exp(eta))`; for "
            "`normalized=False`, the plain formula without log k! (`k*eta - exp(eta)`, "
            "`xlogy(k, rate) - rate`), the same work.",
            machine_line(doc), kernels_table(doc)])
    if name in ("contexts", "gpu_contexts"):
        from bench import contexts

        return "\n\n".join([
            "### Every calling context (`python -m bench contexts`)" if name == "contexts"
            else "### Every calling context, on the GPU (`python -m bench contexts`)",
            "Value and gradient, float64: the baseline's time / fusedlp's time (above 1, fusedlp "
            "is faster), the baseline being autodiff of the named `jax.scipy.stats` density "
            "(of the plain formula for `normalized=False`). Contexts: data as `jit` arguments "
            "with int32 / int64 counts; data closed over (compile-time constants); a vmapped "
            "batch of 10 problems of N/10; five gradient steps in a `lax.fori_loop`; the "
            "gradient with respect to scalar parameters only (every partial a reduction).",
            machine_line(doc), contexts.table(doc["rows"]),
            "XLA temporaries of each compiled program (`memory_analysis().temp_size_in_bytes`) "
            "in N-sized float64 arrays, fusedlp / baseline:",
            contexts.temporaries_table(doc["rows"]),
            *[contexts.numpyro_line(r) for r in doc["numpyro"]],
            _timing_targets(doc["targets"])])
    if name in ("hessian", "gpu_hessian"):
        from bench import hessian

        return "\n\n".join([
            "### Hessians (`python -m bench hessian`)" if name == "hessian"
            else "### Hessians, on the GPU (`python -m bench hessian`)",
            "float64, data as `jit` arguments, median µs per call: `fusedlp.hessian` (reverse "
            "over reverse through the kernels' rules) against `jax.hessian` of autodiff of the "
            "`jax.scipy.stats` density (the plain formula for `normalized=False`); autodiff / "
            "fused above 1: fusedlp is faster. scalar: with respect to every parameter, each a "
            "scalar; glm: with respect to 5 coefficients of `X @ beta`, through exp where the "
            "parameter is a rate or mean, the other parameters fixed. Compile: lower + compile "
            "of each Hessian alone.",
            machine_line(doc), hessian.table(doc["rows"]),
            _timing_targets(doc["overview"]).replace("Targets (this run)", "This run")])
    if name == "fuse":
        from bench.fuse import tables

        return "\n\n".join(["### Kernels built with `fuse` (`python -m bench fuse`)",
                            machine_line(doc), tables(doc["results"]).replace("### ", "#### ")])
    if name == "fit":
        from bench.fit import tables

        return "\n\n".join([
            "### Fitting (`python -m bench fit`)",
            "A normal model with scalar loc and scale. K steps of `fusedlp.fit`'s compiled loop "
            "against the same steps driven from a Python loop, and one bare value-and-gradient "
            "call.", machine_line(doc), tables(doc["results"]).replace("### ", "#### ")])
    if name == "sharding":
        from bench.sharding import _sharding_table

        return "\n\n".join([
            "### Sharding (`python -m bench sharding`)",
            "Value and gradient, jitted, with the data split over 4 forced CPU devices against "
            "the same data on one device (median ms per call, IQR in brackets). The devices "
            "share the machine's cores, so the check is that sharding adds no data movement "
            "(the collectives column), not a speed-up.",
            machine_line(doc), _sharding_table(doc["results"])])
    if name == "gpu_throughput":
        from bench.sharding import throughput_table

        res = doc["results"]
        return "\n\n".join([
            "### Bandwidth on the GPU (`python -m bench sharding --throughput`)",
            "Value and gradient with respect to the N-vector (`loc` of the normal, `eta` of "
            "the log-rate Poisson, int32 counts), fusedlp against `jax.value_and_grad` of the "
            "plain formula, data generated on the device.", machine_line(doc),
            throughput_table(res, doc.get("copy_bandwidth", {}),
                             res[0]["peak_gbps"] if res else None)])
    if name in ("workloads", "gpu_workloads"):
        from bench import workloads

        return "\n\n".join([
            "### Whole jobs (`python -m bench workloads`)" if name == "workloads"
            else "### Whole jobs, on the GPU (`python -m bench workloads`)",
            "Each job timed from start to finish (fit, then its standard errors or summary) "
            "against what a user would otherwise run. fusedlp warm: the median of repeated "
            "calls of the compiled job, its data on the device; compile: the one-off lower + "
            "compile; cold: compile + the first call, on NumPy data (runs before 2026-11-29, "
            "the GPU's among them: compile + warm). "
            "baseline: what fusedlp is compared with, then its time; ratio: the baseline's "
            "time / fusedlp's (above 1, fusedlp is faster). NUTS rows: time per leapfrog step, "
            "the sampling loop compiled once (runs before 2026-11-29, the GPU's among them, "
            "timed `MCMC.run`, which compiles its loop again on every call: a compile in "
            "every step's time). "
            "The agreement table: how far fusedlp's estimates are from statsmodels' (EAM: "
            "from the true parameters; NUTS: between the two posteriors, in posterior sds).",
            machine_line(doc), workloads.table(doc["rows"]).strip(),
            workloads.agreement_md(doc["rows"]).strip()])
    raise ValueError(name)


def _timing_targets(targets) -> str:
    from bench._timing import targets_md

    return targets_md(targets, "Targets (this run)").replace("### ", "#### ").strip()


def render(results_dir: str, sections=SECTIONS) -> str:
    """Every section whose JSON is in ``results_dir``, as one markdown string."""
    out = []
    for name in sections:
        path = os.path.join(results_dir, f"{name}.json")
        if os.path.exists(path):
            with open(path) as fh:
                out.append(section(name, json.load(fh)))
    if not out:
        raise SystemExit(f"no benchmark results (studies.json, kernels.json, ...) in "
                         f"{results_dir}; run a benchmark first, e.g. python -m bench kernels")
    return "\n\n".join(out) + "\n"


def main(args) -> int:
    print(render(args.results, args.section or SECTIONS), end="")
    return 0
