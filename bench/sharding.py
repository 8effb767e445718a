"""Sharding benchmark: value-and-gradient sharded over devices vs unsharded on one device.

Two modes.

**CPU sharding check** (default). In a fresh interpreter started with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the parent process may already have
started jax with one device, and the device count is fixed at start-up), it times the jitted
value-and-gradient of ``normal_lpdf`` (w.r.t. an N-vector ``loc``) and ``poisson_log_lpmf``
(w.r.t. an N-vector ``eta``), float64, at N = 10^6 and 10^7:

* **1 device**: the arrays committed to the first CPU device;
* **4 devices**: the same arrays split with ``fusedlp.shard`` over four forced CPU devices.

The two variants are timed round-robin (``bench._timing.time_interleaved``) after an
ahead-of-time compilation, and checked against each other first. The forced devices share
the machine's cores, so no speed-up is expected on a 2-core machine: the check is that the
sharded program adds nothing, i.e. that its partial sums are combined by an all-reduce of a
few scalars and the data are never gathered. The compiled HLO's collectives are reported.

**GPU throughput** (``--throughput``). On the default backend (a GPU when one is present),
value-and-gradient of the same two kernels and of jax autodiff of the plain formula, at
N = 10^6 ... 10^8 in float32 and float64, reported as effective memory bandwidth: the
bytes a single pass must move (inputs read once, the gradient written once) divided by the
median time, and as a fraction of the device's peak bandwidth (``--peak-gbps``, or the
spec-sheet figure for a known ``device_kind``). On a CPU it runs too (for a smoke test),
reporting GB/s without a peak unless ``--peak-gbps`` is given.

Run ``python -m bench sharding --help`` (or ``python -m bench.sharding --help``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

N_FORCED_DEVICES = 4
KERNELS = ("normal", "poisson_log")
NORMAL_SCALE = 1.3
POISSON_K_MEAN = 1.2
_FORCE_FLAG = "--xla_force_host_platform_device_count"

# Spec-sheet peak memory bandwidth, GB/s (10^9 bytes/s), by a substring of jax's
# device_kind; the first match wins, so the more specific names come first.
PEAK_GBPS = (
    ("GH200", 4000.0),  # before "H200", a substring of "NVIDIA GH200 480GB"
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIe", 2000.0),
    ("H100", 3350.0),  # SXM5 (device_kind "NVIDIA H100 80GB HBM3")
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),  # 40 GB, SXM4 or PCIe
    ("L40S", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
    ("V100", 900.0),
    ("T4", 320.0),
)


def peak_bandwidth_gbps(device_kind: str) -> float | None:
    for key, gbps in PEAK_GBPS:
        if key.lower() in device_kind.lower():
            return gbps
    return None


def bytes_per_element(kernel: str, itemsize: int) -> int:
    """Bytes one pass must move per element for value-and-gradient w.r.t. the N-vector.

    normal: read y and loc, write d/dloc; poisson_log: read k (int32) and eta, write d/deta.
    The scalar value and the scalar parameters are negligible.
    """
    if kernel == "normal":
        return 3 * itemsize
    if kernel == "poisson_log":
        return 4 + 2 * itemsize
    raise ValueError(kernel)


# =============================================================================== kernels


def _functions(kernel: str) -> tuple[Callable, Callable]:
    """(fused, autodiff baseline), each ``f(theta, data) -> scalar``; grad w.r.t. theta."""
    import jax.numpy as jnp
    import jax.scipy.special as jsp

    import fusedlp

    if kernel == "normal":
        def fused(loc, y):
            return fusedlp.normal_lpdf(y, loc, NORMAL_SCALE)

        def plain(loc, y):
            z = (y - loc) / NORMAL_SCALE
            return jnp.sum(-0.5 * z * z - math.log(NORMAL_SCALE) - 0.5 * math.log(2 * math.pi))
    else:
        def fused(eta, k):
            return fusedlp.poisson_log_lpmf(k, eta)

        def plain(eta, k):
            kf = k.astype(eta.dtype)
            return jnp.sum(kf * eta - jnp.exp(eta) - jsp.gammaln(kf + 1))
    return fused, plain


def _host_data(kernel: str, n: int, dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if kernel == "normal":
        theta = rng.normal(0.0, 0.5, n).astype(dt)
        data = (0.3 + rng.normal(0.0, NORMAL_SCALE, n)).astype(dt)
    else:
        theta = np.log(rng.uniform(0.5, 2.0, n)).astype(dt)
        data = rng.poisson(POISSON_K_MEAN, n).astype(np.int32)
    return theta, data


def _device_data(kernel: str, n: int, dtype: str, device):
    """The same distributions generated on the device (no 10^8-element host transfer)."""
    import jax
    import jax.numpy as jnp

    with jax.default_device(device):
        k1, k2 = jax.random.split(jax.random.key(0))
        if kernel == "normal":
            theta = 0.5 * jax.random.normal(k1, (n,), dtype)
            data = 0.3 + NORMAL_SCALE * jax.random.normal(k2, (n,), dtype)
        else:
            theta = jnp.log(jax.random.uniform(k1, (n,), dtype, 0.5, 2.0))
            data = jax.random.poisson(k2, POISSON_K_MEAN, (n,), jnp.int32)
        return jax.block_until_ready((theta, data))


def _collectives(compiled_text: str) -> dict:
    import re

    ops = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
    return {op: len(re.findall(rf"\b{op}(?:-start)?\(", compiled_text)) for op in ops}


def _check_close(name, got, want, dtype):
    rtol = 1e-10 if dtype == "float64" else 1e-4
    gv, gg = got
    wv, wg = want
    if not np.allclose(float(gv), float(wv), rtol=rtol, atol=0):
        raise RuntimeError(f"{name}: value {float(gv)!r} != {float(wv)!r}")
    gg, wg = np.asarray(gg, np.float64), np.asarray(wg, np.float64)
    if not np.allclose(gg, wg, rtol=rtol, atol=rtol * float(np.max(np.abs(wg)))):
        raise RuntimeError(f"{name}: gradients differ by up to {np.max(np.abs(gg - wg)):.3g}")


# ================================================================ CPU sharding (worker)


def _sharding_worker(cfg: dict) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", bool(cfg["async_dispatch"]))
    from bench import _timing
    from fusedlp.sharding import data_mesh, shard

    devices = jax.devices()
    if len(devices) != cfg["devices"]:
        raise SystemExit(f"expected {cfg['devices']} devices, got {devices}")
    mesh = data_mesh(devices)
    one = devices[0]
    results = []
    for kernel in cfg["kernels"]:
        fused, _ = _functions(kernel)
        vg = jax.value_and_grad(fused)
        for dtype in cfg["dtypes"]:
            for n in cfg["sizes"]:
                theta, data = _host_data(kernel, n, dtype)
                single = jax.device_put((theta, data), one)
                split = shard((theta, data), mesh, pad=False)
                f1, lower1, comp1 = _timing.aot_compile(vg, *single)
                f4, lower4, comp4 = _timing.aot_compile(vg, *split)
                coll = _collectives(jax.jit(vg).lower(*split).compile().as_text())
                out1, out4 = f1(*single), f4(*split)
                _check_close(f"{kernel} {dtype} N={n}", out4, out1, dtype)
                g4 = out4[1]
                grad_sharding_kept = g4.sharding.is_equivalent_to(split[0].sharding, 1)
                del out1, out4, g4
                stats = _timing.time_interleaved(
                    {"1 device": lambda f=f1, a=single: f(*a),
                     "4 devices": lambda f=f4, a=split: f(*a)},
                    min_repeats=cfg["min_repeats"], min_total=cfg["min_total"],
                    max_total=cfg["max_total"])
                s1, s4 = stats["1 device"], stats["4 devices"]
                r = {"kernel": kernel, "dtype": dtype, "n": n,
                     "one_device": s1.as_dict(), "sharded": s4.as_dict(),
                     "ratio_sharded_over_one": s4.median / s1.median,
                     "compile_s": {"1 device": lower1 + comp1, "4 devices": lower4 + comp4},
                     "collectives": coll, "grad_sharding_kept": bool(grad_sharding_kept)}
                results.append(r)
                print(f"  {kernel:12s} {dtype} N={n:<9d} 1 device {s1.median * 1e3:8.2f} ms"
                      f"  4 devices {s4.median * 1e3:8.2f} ms  ratio "
                      f"{r['ratio_sharded_over_one']:.3f}  {coll}", file=sys.stderr,
                      flush=True)
                del single, split
    return {"machine": _timing.machine_info(), "results": results}


def _sharding_table(results: list[dict]) -> str:
    from bench._timing import fmt_ratio, fmt_sig

    header = ["kernel", "dtype", "N", "1 device ms (IQR)", "4 devices ms (IQR)",
              "4 dev / 1 dev", "collectives in the sharded program", "grad stays sharded"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|---|:-:|"]
    for r in results:
        def ms(s):
            return f"{fmt_sig(s['median'] * 1e3)} ({fmt_sig(s['iqr'] * 1e3, 2)})"
        coll = ", ".join(f"{op} × {c}" for op, c in r["collectives"].items() if c) or "none"
        lines.append(
            f"| `{r['kernel']}` | {r['dtype']} | 10^{round(math.log10(r['n']))} | "
            f"{ms(r['one_device'])} | {ms(r['sharded'])} | "
            f"{fmt_ratio(r['ratio_sharded_over_one'])} | {coll} | "
            f"{'yes' if r['grad_sharding_kept'] else '**no**'} |")
    return "\n".join(lines)


def _run_sharding(args) -> int:
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else (
        [10**5, 10**6] if args.quick else [10**6, 10**7])
    cfg = {
        "kernels": [k.strip() for k in args.kernels.split(",") if k.strip()],
        "dtypes": [d.strip() for d in (args.dtypes or "float64").split(",") if d.strip()],
        "sizes": sizes, "devices": args.devices, "async_dispatch": bool(args.async_dispatch),
        "quick": bool(args.quick), "min_repeats": 5 if args.quick else 15,
        "min_total": 0.05 if args.quick else (args.min_time or 1.0),
        "max_total": 0.3 if args.quick else max(5.0, args.min_time or 0.0),
    }
    for k in cfg["kernels"]:
        if k not in KERNELS:
            raise SystemExit(f"unknown kernel {k!r}; choose from {','.join(KERNELS)}")
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_FORCE_FLAG)]
    env["XLA_FLAGS"] = " ".join([*flags, f"{_FORCE_FLAG}={args.devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    print(f"# sharding benchmark: {args.devices} forced CPU devices vs 1, sizes {sizes}, "
          f"kernels {cfg['kernels']} (subprocess)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.sharding", "--worker", json.dumps(cfg)],
                          env=env, cwd=root, stdout=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stdout, file=sys.stderr)
        raise SystemExit(f"sharding worker failed with exit code {proc.returncode}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    m = doc["machine"]
    print("## fusedlp sharding benchmark (forced CPU devices)\n")
    print(f"{m['date']}: {m['cpu_model']}, {m['cpu_count']} cores ({m['platform']}); "
          f"jax/jaxlib {m['jax']}/{m['jaxlib']} ({m['backend']}, {len(m['devices'])} devices, "
          f"XLA_FLAGS={m['xla_flags']!r}). Value-and-gradient w.r.t. the N-vector (loc / "
          f"eta), median per call, interleaved; wall time {wall:.0f} s.\n")
    print(_sharding_table(doc["results"]))
    worst = max(r["ratio_sharded_over_one"] for r in doc["results"])
    gathers = sum(r["collectives"]["all-gather"] + r["collectives"]["all-to-all"]
                  for r in doc["results"])
    print(f"\nWorst 4-device / 1-device ratio {worst:.3f}; data-moving collectives in the "
          f"sharded programs: {gathers}.\n")
    if args.json:
        from bench import _timing

        _timing.write_json(args.json, {"benchmark": "fusedlp sharding (forced CPU devices)",
                                       "config": cfg, **doc}, wall)
        print(f"# wrote {args.json}", file=sys.stderr)
    return 0


# ===================================================================== GPU throughput


def _copy_bandwidth(dtype: str, n: int, device, quick: bool) -> dict | None:
    """The device's measured bandwidth: ``x * 2`` over ``n`` elements (read once, written
    once), the ceiling an elementwise pass can reach; None if ``n`` does not fit."""
    import jax
    import jax.numpy as jnp

    from bench import _timing

    try:
        with jax.default_device(device):
            x = jax.block_until_ready(jnp.ones(n, dtype))
        f, _, _ = _timing.aot_compile(lambda x: x * 2, x)
        s = _timing.time_interleaved({"copy": lambda: f(x)}, min_repeats=5 if quick else 20,
                                     min_total=0.05 if quick else 0.5, max_total=5.0)["copy"]
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return None
    per_call = _pipelined(f, (x,))
    return {"n": n, "median_s": s.median, "pipelined_s": per_call,
            "gbps": 2 * np.dtype(dtype).itemsize * n / per_call / 1e9}


def _throughput_row(kernel: str, dtype: str, n: int, variants: dict, device, quick: bool) -> dict:
    """One size's value-and-gradient, fused against autodiff, checked, then timed."""
    from bench import _timing

    theta, data = _device_data(kernel, n, dtype, device)
    compiled, comp = {}, {}
    for name, fn in variants.items():
        compiled[name], lo, co = _timing.aot_compile(fn, theta, data)
        comp[name] = lo + co
    outs = {name: f(theta, data) for name, f in compiled.items()}
    _check_close(f"{kernel} {dtype} N={n}", outs["fused"], outs["autodiff"], dtype)
    del outs
    stats = _timing.time_interleaved(
        {name: (lambda f=f, a=(theta, data): f(*a)) for name, f in compiled.items()},
        min_repeats=5 if quick else 20, min_total=0.05 if quick else 0.5, max_total=5.0)
    row = {"kernel": kernel, "dtype": dtype, "n": n, "compile_s": comp}
    for name, st in stats.items():
        row[name] = dict(st.as_dict(), pipelined_s=_pipelined(compiled[name], (theta, data)))
    row["autodiff_over_fused"] = row["autodiff"]["pipelined_s"] / row["fused"]["pipelined_s"]
    return row


def _pipelined(f, args, calls: int = 10, repeats: int = 7) -> float:
    """Seconds per call of ``calls`` calls dispatched back to back and waited for once (the
    median of ``repeats``): the device's time per call, without the host's round trip that
    a call waited for alone pays (what a loop of calls on the device sees)."""
    import jax

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = f(*args)  # only the last output is kept: the calls run in order
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls)
    return float(np.median(times))


def _run_throughput(args) -> int:
    import jax

    jax.config.update("jax_enable_x64", True)
    from bench import _timing

    layouts = _timing.use_layout(args.layout)
    device = jax.devices()[0]
    kind = getattr(device, "device_kind", str(device))
    peak = args.peak_gbps or peak_bandwidth_gbps(kind)
    if device.platform == "cpu" and args.peak_gbps is None:
        peak = None
    max_n = float(args.max_n) if args.max_n else (1e6 if args.quick else 1e8)
    sizes = [10**e for e in range(6, round(math.log10(max_n)) + 1)] or [int(max_n)]
    dtypes = [d.strip() for d in (args.dtypes or "float32,float64").split(",") if d.strip()]
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    print(f"# throughput on {device} ({kind}, platform {device.platform}); peak "
          f"{peak if peak else 'unknown'} GB/s; sizes {sizes}; layouts {layouts}",
          file=sys.stderr, flush=True)
    t_start = time.perf_counter()
    copies = {d: _copy_bandwidth(d, max(sizes), device, args.quick) for d in dtypes}
    results = []
    for kernel in kernels:
        fused, plain = _functions(kernel)
        variants = {"fused": jax.value_and_grad(fused), "autodiff": jax.value_and_grad(plain)}
        for dtype in dtypes:
            itemsize = np.dtype(dtype).itemsize
            for n in sizes:
                try:
                    row = _throughput_row(kernel, dtype, n, variants, device, args.quick)
                except jax.errors.JaxRuntimeError as e:
                    if "RESOURCE_EXHAUSTED" not in str(e):
                        raise
                    print(f"  {kernel:12s} {dtype} N={n:<10d} out of device memory: skipped",
                          file=sys.stderr, flush=True)
                    continue
                moved = bytes_per_element(kernel, itemsize) * n
                copy = copies[dtype]
                row.update(bytes_moved=moved, peak_gbps=peak)
                for name in variants:
                    # the bandwidth a pass reaches: bytes over the device's time per call
                    # (pipelined), the time of a call waited for alone beside it
                    v = row[name]
                    v["gbps"] = moved / v["pipelined_s"] / 1e9
                    v["fraction_of_peak"] = v["gbps"] / peak if peak else None
                    v["fraction_of_copy"] = v["gbps"] / copy["gbps"] if copy else None
                results.append(row)
                f = row["fused"]
                print(f"  {kernel:12s} {dtype} N={n:<10d} fused {f['pipelined_s'] * 1e3:8.3f} ms "
                      f"{f['gbps']:8.1f} GB/s"
                      + (f" ({f['fraction_of_peak']:.0%} of peak)" if peak else "")
                      + f"  autodiff/fused {row['autodiff_over_fused']:.2f}",
                      file=sys.stderr, flush=True)
    wall = time.perf_counter() - t_start
    machine = _timing.machine_info()
    machine["device_kind"] = kind
    machine["layouts"] = layouts
    print("## fusedlp value-and-gradient throughput\n")
    print(f"{machine['date']}: {kind} ({device.platform}), jax {machine['jax']}; peak "
          f"bandwidth {f'{peak:g} GB/s' if peak else 'unknown'} "
          f"({'--peak-gbps' if args.peak_gbps else 'spec sheet'}). GB/s = bytes one pass "
          f"must move (inputs read once, gradient written once) / time per call. "
          f"Wall time {wall:.0f} s.\n")
    print(throughput_table(results, copies, peak))
    if args.json:
        _timing.write_json(args.json, {"benchmark": "fusedlp throughput",
                                       "machine": machine, "config": {"quick": bool(args.quick)},
                                       "copy_bandwidth": copies,
                                       "results": results}, wall)
        print(f"# wrote {args.json}", file=sys.stderr)
    return 0


def throughput_table(results: list[dict], copies: dict, peak: float | None) -> str:
    """The throughput run's markdown: the measured copy per dtype, one row per kernel, dtype
    and N, and the verdict on the 70 %-of-peak target in float32 at N = 10^8 (or the largest
    N run, if smaller)."""
    from bench import _timing

    lines = [f"Measured copy (x * 2, {d}, N = {c['n']:.0e}): {c['gbps']:.0f} GB/s"
             + (f", {c['gbps'] / peak:.0%} of peak" if peak else "") + "."
             for d, c in copies.items() if c]
    lines += ["", "ms: per call, of calls dispatched back to back (the device's time; a call "
              "waited for alone adds the host's round trip: the last column). GB/s: bytes one "
              "pass must move / that time.", "",
              "| kernel | dtype | N | bytes/elem | fused ms | fused GB/s | fused % peak "
              "| fused % copy | autodiff ms | autodiff GB/s | autodiff % peak "
              "| autodiff / fused | fused ms, one call waited for |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    fmt = _timing.fmt_sig

    def pct(v, key):
        return f"{100 * v[key]:.0f} %" if v.get(key) else "—"

    for r in results:
        f, a = r["fused"], r["autodiff"]
        lines.append(f"| `{r['kernel']}` | {r['dtype']} | 10^{round(math.log10(r['n']))} | "
                     f"{r['bytes_moved'] // r['n']} | {fmt(f['pipelined_s'] * 1e3)} | "
                     f"{fmt(f['gbps'])} | {pct(f, 'fraction_of_peak')} | "
                     f"{pct(f, 'fraction_of_copy')} | {fmt(a['pipelined_s'] * 1e3)} | "
                     f"{fmt(a['gbps'])} | {pct(a, 'fraction_of_peak')} | "
                     f"{fmt(a['pipelined_s'] / f['pipelined_s'])} | {fmt(f['median'] * 1e3)} |")
    at = min(10**8, max((r["n"] for r in results), default=0))
    if peak:
        lines.append("")
        for r in results:
            if r["dtype"] == "float32" and r["n"] == at:
                ok = r["fused"]["fraction_of_peak"] >= 0.7
                lines.append(f"Target >= 70 % of peak, `{r['kernel']}` float32 N = "
                             f"10^{round(math.log10(at))}: "
                             f"{'met' if ok else '**not met**'} "
                             f"({100 * r['fused']['fraction_of_peak']:.0f} %).")
    return "\n".join(lines)


# =============================================================================== CLI


def add_arguments(p) -> None:
    from bench import _timing

    p.add_argument("--quick", action="store_true",
                   help="small sizes and few repeats (well under 30 s)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results here")
    p.add_argument("--kernels", default=",".join(KERNELS),
                   help=f"comma-separated subset of {','.join(KERNELS)}")
    p.add_argument("--dtypes", default=None,
                   help="comma-separated (default: float64 for the sharding check, "
                        "float32,float64 for --throughput)")
    p.add_argument("--sizes", default=None,
                   help="sharding check: comma-separated N (default 1e6,1e7; quick 1e5,1e6)")
    p.add_argument("--devices", type=int, default=N_FORCED_DEVICES,
                   help="forced CPU devices for the sharding check (default 4)")
    p.add_argument("--min-time", type=float, default=None,
                   help="sharding check: seconds of timed calls per variant (default 1)")
    p.add_argument("--async-dispatch", action="store_true",
                   help="keep JAX's asynchronous CPU dispatch (default off, as in `kernels`)")
    p.add_argument("--throughput", action="store_true",
                   help="instead: value-and-gradient bandwidth on the default device (GPU)")
    p.add_argument("--max-n", type=float, default=None,
                   help="--throughput: largest N (default 1e8; quick 1e6)")
    _timing.add_layout_argument(p, help_prefix="--throughput: ")
    p.add_argument("--peak-gbps", type=float, default=None,
                   help="--throughput: peak memory bandwidth in GB/s (default: spec sheet "
                        "by device_kind: " + ", ".join(f"{k} {v:g}" for k, v in PEAK_GBPS) + ")")


def main(args) -> int:
    if args.throughput:
        return _run_throughput(args)
    return _run_sharding(args)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(_sharding_worker(json.loads(sys.argv[2]))))
        sys.exit(0)
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.sharding",
                                     description=(__doc__ or "").strip().splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
