"""Kernel benchmark: fused kernels vs jax autodiff vs a hand-written numba loop.

For every kernel, dtype and size N = 10 ... 10^7 (by decades) this times, in one run:

* the fused ``fusedlp`` kernel: value, gradient, value-and-gradient (jit, CPU);
* jax autodiff of what a user would write without fusedlp (``jax.scipy.stats`` or the
  plain formula): value, gradient, value-and-gradient;
* a second compilation of the first autodiff baseline, timed as a variant of its own: the
  two copies run the same program, so their ratio is this run's noise (an A/A test), the
  yardstick for "slower than autodiff beyond noise";
* a single-threaded ``@njit(fastmath=True)`` loop written as a careful hand-optimiser
  would (one pass for value and gradient, precomputed constants, float64 accumulator also
  for float32 data), allocating its gradient array on every call (as a JAX function must).

JAX's asynchronous CPU dispatch is switched off by default (``--async-dispatch`` keeps it):
with it on, every call pays a host-thread hand-off of 10-30 µs on this kind of machine,
which swamps the kernels below N ~ 1e5 and says nothing about them.

Correctness is checked for every size before anything is timed; a disagreement aborts the
run. Results go to a markdown table per kernel x dtype on stdout and to a JSON file.

Run ``python -m bench kernels --help``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import jax
import numpy as np

from bench import _timing
from bench._timing import NOISE, fmt_ratio, fmt_us

HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
NORMAL_SCALE = 1.3
POISSON_K_MEAN = 1.2
EAM_A = math.exp(-3.0)
EAM_BETA = 3.0
EAM_COEFFS = (0.0, 1.0, 1.0, 0.25)

KINDS = ("value", "grad", "vg")
FAMILIES = ("normal", "poisson", "poisson_log", "eam")


class CorrectnessError(RuntimeError):
    """A fused kernel, a baseline and the numba loop disagree: nothing is timed."""


# =============================================================================== numba


def _numba_normal(ft, normalized: bool):
    """Hand loops for f(loc) = sum_i log N(y_i | loc_i, scale), gradient w.r.t. loc."""
    from numba import njit

    one, half = ft(1.0), ft(0.5)
    const = HALF_LOG_2PI if normalized else 0.0

    @njit(fastmath=True)
    def value(loc, y, scale):
        inv2 = one / (scale * scale)
        s = 0.0  # float64 accumulator, also for float32 data
        for i in range(loc.shape[0]):
            d = y[i] - loc[i]
            s += d * d
        return -half * s * inv2 - loc.shape[0] * (np.log(scale) + const)

    @njit(fastmath=True)
    def grad(loc, y, scale):
        inv2 = one / (scale * scale)
        g = np.empty_like(loc)
        for i in range(loc.shape[0]):
            g[i] = (y[i] - loc[i]) * inv2
        return g

    @njit(fastmath=True)
    def vg(loc, y, scale):
        inv2 = one / (scale * scale)
        g = np.empty_like(loc)
        s = 0.0  # float64 accumulator, also for float32 data
        for i in range(loc.shape[0]):
            d = y[i] - loc[i]
            s += d * d
            g[i] = d * inv2
        return -half * s * inv2 - loc.shape[0] * (np.log(scale) + const), g

    return {"value": value, "grad": grad, "vg": vg}


def _numba_poisson(ft, normalized: bool):
    """Hand loops for f(rate) = sum_i log Poisson(k_i | rate_i), gradient w.r.t. rate."""
    from numba import njit

    one = ft(1.0)

    if normalized:

        @njit(fastmath=True)
        def value(rate, k):
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(rate.shape[0]):
                kf = ft(k[i])
                s += kf * np.log(rate[i]) - rate[i] - math.lgamma(kf + one)
            return s

        @njit(fastmath=True)
        def vg(rate, k):
            g = np.empty_like(rate)
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(rate.shape[0]):
                kf = ft(k[i])
                r = rate[i]
                s += kf * np.log(r) - r - math.lgamma(kf + one)
                g[i] = kf / r - one
            return s, g

    else:

        @njit(fastmath=True)
        def value(rate, k):
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(rate.shape[0]):
                s += ft(k[i]) * np.log(rate[i]) - rate[i]
            return s

        @njit(fastmath=True)
        def vg(rate, k):
            g = np.empty_like(rate)
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(rate.shape[0]):
                kf = ft(k[i])
                r = rate[i]
                s += kf * np.log(r) - r
                g[i] = kf / r - one
            return s, g

    @njit(fastmath=True)
    def grad(rate, k):
        g = np.empty_like(rate)
        for i in range(rate.shape[0]):
            g[i] = ft(k[i]) / rate[i] - one
        return g

    return {"value": value, "grad": grad, "vg": vg}


def _numba_poisson_log(ft, normalized: bool):
    """Hand loops for f(eta) = sum_i log Poisson(k_i | exp(eta_i)), gradient w.r.t. eta."""
    from numba import njit

    one = ft(1.0)

    if normalized:

        @njit(fastmath=True)
        def value(eta, k):
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(eta.shape[0]):
                kf = ft(k[i])
                s += kf * eta[i] - np.exp(eta[i]) - math.lgamma(kf + one)
            return s

        @njit(fastmath=True)
        def vg(eta, k):
            g = np.empty_like(eta)
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(eta.shape[0]):
                kf = ft(k[i])
                e = np.exp(eta[i])
                s += kf * eta[i] - e - math.lgamma(kf + one)
                g[i] = kf - e
            return s, g

    else:

        @njit(fastmath=True)
        def value(eta, k):
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(eta.shape[0]):
                s += ft(k[i]) * eta[i] - np.exp(eta[i])
            return s

        @njit(fastmath=True)
        def vg(eta, k):
            g = np.empty_like(eta)
            s = 0.0  # float64 accumulator, also for float32 data
            for i in range(eta.shape[0]):
                kf = ft(k[i])
                e = np.exp(eta[i])
                s += kf * eta[i] - e
                g[i] = kf - e
            return s, g

    @njit(fastmath=True)
    def grad(eta, k):
        g = np.empty_like(eta)
        for i in range(eta.shape[0]):
            g[i] = ft(k[i]) - np.exp(eta[i])
        return g

    return {"value": value, "grad": grad, "vg": vg}


def _numba_eam(ft, normalized: bool = True):
    """The EAM write-up's two-pass loop: pass 1 stores e_j = rho(r_j) and sums p, pass 2 scales by F'(p)."""
    from numba import njit

    one, two, three, quarter = ft(1.0), ft(2.0), ft(3.0), ft(0.25)
    m3 = ft(-3.0)

    @njit(fastmath=True)
    def value(r):
        p = 0.0  # float64 accumulator, also for float32 data
        for j in range(r.shape[0]):
            p += np.exp(m3 * (r[j] + one))
        p2 = p * p
        return p2 + p2 * p + quarter * p2 * p2

    @njit(fastmath=True)
    def vg(r):
        e = np.empty_like(r)
        p = 0.0  # float64 accumulator, also for float32 data
        for j in range(r.shape[0]):
            ej = np.exp(m3 * (r[j] + one))
            e[j] = ej
            p += ej
        p2 = p * p
        c = ft(m3 * (two * p + three * p2 + p2 * p))  # rho'(r) F'(p) = -3 rho(r) F'(p)
        for j in range(r.shape[0]):
            e[j] *= c
        return p2 + p2 * p + quarter * p2 * p2, e

    @njit(fastmath=True)
    def grad(r):
        e = np.empty_like(r)
        p = 0.0  # float64 accumulator, also for float32 data
        for j in range(r.shape[0]):
            ej = np.exp(m3 * (r[j] + one))
            e[j] = ej
            p += ej
        c = ft(m3 * (two * p + three * p * p + p * p * p))
        for j in range(r.shape[0]):
            e[j] *= c
        return e

    return {"value": value, "grad": grad, "vg": vg}


# =============================================================================== cases


@dataclass
class Baseline:
    key: str  # short column label, e.g. "stats"
    what: str  # one-line description for the table caption
    fn: Callable  # jax, f(theta, *consts) -> scalar
    # value(baseline) - value(kernel), a constant of the data (e.g. the log k! that a
    # normalized=False kernel drops): numpy (theta, *consts) -> float, for the check only
    offset: Callable | None = None


@dataclass
class Case:
    key: str  # unique, e.g. "poisson_propto"
    family: str  # what --kernels selects
    title: str
    workload: str
    make_data: Callable  # (n, dtype, rng) -> (theta, consts): numpy, used by all impls
    make_fused: Callable  # dtype -> jax f(theta, *consts)
    baselines: Callable  # dtype -> list[Baseline]; the first one is "the" autodiff baseline
    make_numba: Callable  # ft -> {"value", "grad", "vg"}
    normalized: bool | None = None
    baseline_keys: list[str] = field(default_factory=list)


def _normal_data(n, dt, rng):
    loc = rng.normal(0.0, 0.5, n).astype(dt)
    y = (0.3 + rng.normal(0.0, NORMAL_SCALE, n)).astype(dt)
    return loc, (y, dt.type(NORMAL_SCALE))


def _poisson_data(n, dt, rng):
    rate = rng.uniform(0.5, 2.0, n).astype(dt)
    k = rng.poisson(POISSON_K_MEAN, n).astype(np.int32)
    return rate, (k,)


def _poisson_log_data(n, dt, rng):
    rate, (k,) = _poisson_data(n, dt, rng)
    return np.log(rate).astype(dt), (k,)


def _eam_data(n, dt, rng):
    return rng.uniform(0.0, 1.0, n).astype(dt), ()


def _cases() -> list[Case]:
    import jax.numpy as jnp
    import jax.scipy.special as jsp
    import jax.scipy.stats as jst

    import fusedlp

    def normal_fused(dt):
        return lambda loc, y, scale: fusedlp.normal_lpdf(y, loc, scale)

    def normal_baselines(dt):
        return [Baseline("stats", "jax.grad of sum(jax.scipy.stats.norm.logpdf(y, loc, scale))",
                         lambda loc, y, scale: jnp.sum(jst.norm.logpdf(y, loc, scale)))]

    def poisson_fused(normalized):
        return lambda dt: (lambda rate, k: fusedlp.poisson_lpmf(k, rate, normalized=normalized))

    stats_poisson = Baseline(
        "stats", "jax.grad of sum(jax.scipy.stats.poisson.logpmf(k, rate))",
        lambda rate, k: jnp.sum(jst.poisson.logpmf(k, rate)))
    stats_poisson_offset = Baseline(stats_poisson.key, stats_poisson.what + " (includes -log k!)",
                                    stats_poisson.fn, _minus_sum_log_factorial)

    def plain_poisson_propto(rate, k):
        return jnp.sum(jsp.xlogy(k.astype(rate.dtype), rate) - rate)

    def poisson_log_fused(normalized):
        return lambda dt: (
            lambda eta, k: fusedlp.poisson_log_lpmf(k, eta, normalized=normalized))

    stats_poisson_log = Baseline(
        "stats", "jax.grad of sum(jax.scipy.stats.poisson.logpmf(k, exp(eta)))",
        lambda eta, k: jnp.sum(jst.poisson.logpmf(k, jnp.exp(eta))))
    stats_poisson_log_offset = Baseline(
        stats_poisson_log.key, stats_poisson_log.what + " (includes -log k!)",
        stats_poisson_log.fn, _minus_sum_log_factorial)

    def plain_poisson_log(normalized):
        def f(eta, k):
            kf = k.astype(eta.dtype)
            t = kf * eta - jnp.exp(eta)
            if normalized:
                t = t - jsp.gammaln(kf + 1)
            return jnp.sum(t)

        what = "k*eta - exp(eta)" + (" - gammaln(k+1)" if normalized else "")
        return Baseline("plain", f"jax.grad of sum({what})", f)

    def eam_fused(dt):
        if np.dtype(dt) == np.float64:
            return lambda r: fusedlp.eam_energy(r)  # the defaults: the EAM write-up's potential
        # float32 parameters passed explicitly: the float64 defaults would promote r
        density = (np.float32(EAM_A), np.float32(EAM_BETA))
        coeffs = np.asarray(EAM_COEFFS, np.float32)
        return lambda r: fusedlp.eam_energy(r, density=density, embedding=coeffs)

    def eam_plain(r):
        rho = jnp.sum(jnp.exp(-3 * (r + 1)))
        return rho**2 + rho**3 + 0.25 * rho**4

    cases = [
        Case("normal", "normal", "normal_lpdf(y, loc, scale)",
             "f(loc) = sum_i log N(y_i | loc_i, scale), d/dloc; scale = 1.3 (jnp scalar)",
             _normal_data, normal_fused, normal_baselines,
             partial(_lazy_numba, _numba_normal, True), normalized=True),
        Case("poisson", "poisson", "poisson_lpmf(k, rate)",
             "f(rate) = sum_i log Poisson(k_i | rate_i), d/drate; k ~ Poisson(1.2) int32",
             _poisson_data, poisson_fused(True), lambda dt: [stats_poisson],
             partial(_lazy_numba, _numba_poisson, True), normalized=True),
        Case("poisson_propto", "poisson", "poisson_lpmf(k, rate, normalized=False)",
             "f(rate) = sum_i k_i log rate_i - rate_i, d/drate; k ~ Poisson(1.2) int32",
             _poisson_data, poisson_fused(False),
             lambda dt: [Baseline("plain", "jax.grad of sum(xlogy(k, rate) - rate)",
                                  plain_poisson_propto), stats_poisson_offset],
             partial(_lazy_numba, _numba_poisson, False), normalized=False),
        Case("poisson_log", "poisson_log", "poisson_log_lpmf(k, eta)",
             "f(eta) = sum_i log Poisson(k_i | exp(eta_i)), d/deta; k ~ Poisson(1.2) int32",
             _poisson_log_data, poisson_log_fused(True),
             lambda dt: [stats_poisson_log, plain_poisson_log(True)],
             partial(_lazy_numba, _numba_poisson_log, True), normalized=True),
        Case("poisson_log_propto", "poisson_log", "poisson_log_lpmf(k, eta, normalized=False)",
             "f(eta) = sum_i k_i eta_i - exp(eta_i), d/deta; k ~ Poisson(1.2) int32",
             _poisson_log_data, poisson_log_fused(False),
             lambda dt: [stats_poisson_log_offset, plain_poisson_log(False)],
             partial(_lazy_numba, _numba_poisson_log, False), normalized=False),
        Case("eam", "eam", "eam_energy(r) (default density and embedding)",
             "one site, N neighbours, r ~ U(0, 1): E(r) = F(sum_j exp(-3(r_j+1))), "
             "F(p) = p^2 + p^3 + p^4/4, d/dr",
             _eam_data, eam_fused,
             lambda dt: [Baseline("plain", "jax.grad of rho = sum(exp(-3(r+1))); "
                                  "rho**2 + rho**3 + 0.25*rho**4", eam_plain)],
             partial(_lazy_numba, _numba_eam, True)),
    ]
    for c in cases:
        c.baseline_keys = [b.key for b in c.baselines(np.float64)]
    return cases


def _minus_sum_log_factorial(theta, k) -> float:
    from scipy.special import gammaln

    return -float(np.sum(gammaln(np.asarray(k, np.float64) + 1.0)))


_NUMBA_CACHE: dict = {}


def _lazy_numba(factory, normalized, ft):
    key = (factory.__name__, normalized, np.dtype(ft).name)
    if key not in _NUMBA_CACHE:
        _NUMBA_CACHE[key] = factory(np.dtype(ft).type, normalized)
    return _NUMBA_CACHE[key]


# =============================================================================== checks


def _split(out, kind):
    """(value or None, grad or None) as float64 numpy from a variant's output."""
    if kind == "value":
        return float(np.asarray(out)), None
    if kind == "grad":
        return None, np.asarray(out, dtype=np.float64)
    if kind in ("write", "noop"):  # theta * 2: nothing to check
        return None, None
    v, g = out
    return float(np.asarray(v)), np.asarray(g, dtype=np.float64)


def _tolerances(dt, n):
    """(rtol of the summed value, rtol of the gradient) against the float64 reference."""
    if dt == np.float64:
        return 1e-10, 1e-10
    # float32: XLA's reductions and the numba loops' float64 accumulators stay within ~1e-6
    # of the float64 reference even at N = 1e7; 1e-4 leaves room and still catches bugs.
    return 1e-4, 1e-4


def _check(case: Case, dt, n, outputs: dict, ref_value: float, ref_grad: np.ndarray,
           offsets: dict[str, float]) -> dict:
    """Compare every variant with the float64 hand loop on the same inputs; raise on mismatch."""
    rtol_v, rtol_g = _tolerances(dt, n)
    gscale = float(np.max(np.abs(ref_grad))) if ref_grad.size else 1.0
    errs = {}
    problems = []
    for name, out in outputs.items():
        impl, kind = name.split(".")
        v, g = _split(out, kind)
        e = {}
        if v is not None:
            ref = ref_value + offsets.get(impl, 0.0)
            rel = abs(v - ref) / max(abs(ref), 1e-300)
            e["value_rel_err"] = rel
            if not (rel <= rtol_v):
                problems.append(f"{name}: value {v!r} vs reference {ref!r} "
                                f"(rel err {rel:.3g} > {rtol_v:.1g})")
        if g is not None:
            if g.shape != ref_grad.shape:
                problems.append(f"{name}: gradient shape {g.shape} != {ref_grad.shape}")
            else:
                err = float(np.max(np.abs(g - ref_grad) / (np.abs(ref_grad) + gscale)))
                e["grad_err"] = err  # max |g - g_ref| / (|g_ref| + max|g_ref|)
                ok = np.allclose(g, ref_grad, rtol=rtol_g, atol=rtol_g * gscale)
                if not ok or not np.all(np.isfinite(g)):
                    problems.append(f"{name}: gradient differs from the reference "
                                    f"(max scaled err {err:.3g}, rtol {rtol_g:.1g})")
        errs[name] = e
    if problems:
        raise CorrectnessError(
            f"\n\n*** CORRECTNESS FAILURE: {case.key}, {np.dtype(dt).name}, N={n} ***\n  "
            + "\n  ".join(problems) + "\nNothing was timed for this configuration; aborting.\n")
    return {"rtol_value": rtol_v, "rtol_grad": rtol_g, "errors": errs}


# =============================================================================== run


@dataclass
class Config:
    sizes: list[int]
    dtypes: list[str]
    families: list[str]
    min_repeats: int = 7
    min_repeats_large: int = 5  # at N >= 10^7
    min_total: float = 0.2  # seconds per variant
    max_total: float = 1.0  # seconds per variant (caps the repeats of slow calls)
    max_repeats: int = 20_000
    quick: bool = False
    async_dispatch: bool = False
    seed: int = 20240601


def _jax_variants(fn, args):
    out = {}
    for kind, f in (("value", fn), ("grad", jax.grad(fn)), ("vg", jax.value_and_grad(fn))):
        jitted, lower_s, compile_s = _timing.aot_compile(f, *args)
        out[kind] = (jitted, {"lower_s": lower_s, "compile_s": compile_s})
    return out


def _write_variant(args):
    """One elementwise pass writing a fresh array of the gradient's size (theta * 2).

    With the fused value's time it gives the "floor" of a value-and-gradient on XLA:CPU,
    which runs a reduction and an elementwise output as separate loops and pays for a fresh
    output array's pages: floor = value + write - noop, timed in the same run, where noop (a
    call that reads one element) takes out the second call's dispatch overhead. (Jitting the
    value and theta * 2 together is no floor: XLA then fuses the two and can slow the value.)
    """
    out = {}
    for kind, f in (("write", lambda theta, *consts: theta * 2.0),
                    ("noop", lambda theta, *consts: theta.reshape(-1)[0] * 2.0)):
        jitted, lower_s, compile_s = _timing.aot_compile(f, *args)
        out[kind] = (jitted, {"lower_s": lower_s, "compile_s": compile_s})
    return out


def bench_one(case: Case, dtype: str, n: int, cfg: Config) -> dict:
    import jax.numpy as jnp

    dt = np.dtype(dtype)
    rng = np.random.default_rng([cfg.seed, n, FAMILIES.index(case.family)])
    theta, consts = case.make_data(n, dt, rng)
    jtheta = jnp.asarray(theta)
    jconsts = tuple(jnp.asarray(c) for c in consts)
    jargs = (jtheta, *jconsts)
    assert jtheta.dtype == dt, (jtheta.dtype, dt)

    impls: dict[str, dict[str, tuple[Callable, dict]]] = {}
    impls["fused"] = _jax_variants(case.make_fused(dt), jargs)
    impls["write"] = _write_variant(jargs)
    offsets = {}
    baselines = case.baselines(dt)
    for b in baselines:
        impls[b.key] = _jax_variants(b.fn, jargs)
        if b.offset is not None:
            offsets[b.key] = b.offset(theta, *consts)
    # A/A: the first baseline compiled again, as its own executable and timed as its own
    # variant. Same program, so baseline / aa is pure noise.
    first = baselines[0]
    impls["aa"] = _jax_variants(lambda *a: first.fn(*a), jargs)  # a new function: compiled anew
    if first.key in offsets:
        offsets["aa"] = offsets[first.key]

    numba_fns = case.make_numba(dt.type)
    impls["numba"] = {}
    for kind in KINDS:
        t0 = time.perf_counter()
        numba_fns[kind](theta, *consts)  # first call compiles on the first size of a dtype
        first_call_s = time.perf_counter() - t0
        impls["numba"][kind] = (numba_fns[kind], {"first_call_s": first_call_s})

    # ---- correctness, before any timing
    outputs = {}
    for impl, kinds in impls.items():
        args = (theta, *consts) if impl == "numba" else jargs
        for kind, (fn, _) in kinds.items():
            outputs[f"{impl}.{kind}"] = jax.device_get(fn(*args))
    ref_fns = case.make_numba(np.float64)
    def up(a):  # float32 inputs, exactly, as float64 (scalars stay scalars)
        if not np.issubdtype(np.asarray(a).dtype, np.floating):
            return a
        return np.float64(a) if np.ndim(a) == 0 else np.asarray(a, np.float64)

    ref_v, ref_g = ref_fns["vg"](up(theta), *(up(c) for c in consts))
    check = _check(case, dt, n, outputs, float(ref_v), np.asarray(ref_g, np.float64), offsets)
    del outputs

    # ---- timing, all variants round-robin
    calls = {}
    for impl, kinds in impls.items():
        args = (theta, *consts) if impl == "numba" else jargs
        for kind, (fn, _) in kinds.items():
            calls[f"{impl}.{kind}"] = partial(fn, *args)
    stats = _timing.time_interleaved(
        calls,
        min_repeats=cfg.min_repeats_large if n >= 10**7 else cfg.min_repeats,
        min_total=cfg.min_total,
        max_total=cfg.max_total,
        max_repeats=cfg.max_repeats,
    )
    variants = {}
    for impl, kinds in impls.items():
        for kind, (_, meta) in kinds.items():
            name = f"{impl}.{kind}"
            variants[name] = {**stats[name].as_dict(), **meta}

    med = {name: s.median for name, s in stats.items()}
    ratios = {
        "fused_grad_over_value": med["fused.grad"] / med["fused.value"],
        "fused_vg_over_value": med["fused.vg"] / med["fused.value"],
        "fused_vg_over_numba_vg": med["fused.vg"] / med["numba.vg"],
        "fused_value_over_numba_value": med["fused.value"] / med["numba.value"],
        "floor_vg_over_value": (med["fused.value"] + med["write.write"] - med["write.noop"])
        / med["fused.value"],
    }
    for b in case.baseline_keys:
        for kind in KINDS:
            ratios[f"{b}_{kind}_over_fused_{kind}"] = med[f"{b}.{kind}"] / med[f"fused.{kind}"]
    for kind in KINDS:
        ratios[f"aa_{kind}"] = med[f"{case.baseline_keys[0]}.{kind}"] / med[f"aa.{kind}"]
    return {
        "case": case.key, "family": case.family, "kernel": case.title,
        "normalized": case.normalized, "dtype": dt.name, "n": n,
        "baselines": case.baseline_keys, "variants": variants, "ratios": ratios,
        "check": check,
    }


# =============================================================================== output


def _row(r: dict) -> list[str]:
    v = r["variants"]
    med = lambda name: v[name]["median"]  # noqa: E731
    cells = [f"10^{round(math.log10(r['n']))}" if r["n"] >= 10 else str(r["n"]),
             fmt_us(med("fused.value")), fmt_us(med("fused.grad")), fmt_us(med("fused.vg")),
             fmt_ratio(r["ratios"]["fused_vg_over_value"]),
             fmt_ratio(r["ratios"].get("floor_vg_over_value"))]
    for b in r["baselines"]:
        cells += [fmt_us(med(f"{b}.vg")), fmt_ratio(r["ratios"][f"{b}_vg_over_fused_vg"])]
    cells += [fmt_us(med("numba.vg")), fmt_ratio(r["ratios"]["fused_vg_over_numba_vg"])]
    return cells


def _md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def tables(results: list[dict], cases: list[Case]) -> str:
    """One markdown table per kernel x dtype, then a compact compile-time table."""
    by_case = {c.key: c for c in cases}
    out = []
    keys = list(dict.fromkeys((r["case"], r["dtype"]) for r in results))
    for ck, dtype in keys:
        rows = sorted((r for r in results if r["case"] == ck and r["dtype"] == dtype),
                      key=lambda r: r["n"])
        case = by_case[ck]
        baselines = {b.key: b.what for b in case.baselines(np.dtype(dtype))}
        header = ["N", "value µs", "grad µs", "v&g µs", "v&g/value", "floor/value"]
        for i, b in enumerate(rows[0]["baselines"]):
            tag = f"autodiff[{b}]"
            header += [f"{tag} v&g µs", f"{tag}/fused"]
        header += ["numba v&g µs", "fused/numba"]
        out.append(f"### {case.title} — {dtype}\n")
        out.append(f"Workload: {case.workload}. Times are medians per call.  ")
        for b, what in baselines.items():
            out.append(f"autodiff[{b}] = {what}.  ")
        out.append("numba = single-thread @njit(fastmath=True) loop, "
                   "gradient allocated per call.  ")
        out.append("floor = (fused value + one elementwise pass writing a fresh array of "
                   "the gradient's size, theta * 2, less one call's dispatch) / fused value, "
                   "timed in the same run: what "
                   "a value-and-gradient costs at least on XLA:CPU, which runs the value's "
                   "reduction and an elementwise output as separate loops.\n")
        out.append(_md(header, [_row(r) for r in rows]))
        out.append("")
    # compile times: median over sizes (they hardly depend on N)
    header = ["kernel", "dtype", "fused value", "fused grad", "fused v&g", "autodiff v&g",
              "numba first call (all 3)"]
    rows = []
    for ck, dtype in keys:
        rs = [r for r in results if r["case"] == ck and r["dtype"] == dtype]

        def cms(name, rs=rs):
            vals = [r["variants"][name]["lower_s"] + r["variants"][name]["compile_s"] for r in rs]
            return _timing.fmt_sig(float(np.median(vals)) * 1e3)

        first = rs[0]  # smallest N: includes numba's compilation for this dtype
        nb = sum(first["variants"][f"numba.{k}"]["first_call_s"] for k in KINDS)
        rows.append([ck, dtype, cms("fused.value"), cms("fused.grad"), cms("fused.vg"),
                     cms(f"{first['baselines'][0]}.vg"), _timing.fmt_sig(nb * 1e3)])
    out.append("### Compile times (ms; jax: lower + compile, median over N)\n")
    out.append(_md(header, rows))
    out.append("")
    return "\n".join(out)


def evaluate_targets(results: list[dict], dtype: str = "float64") -> list[dict]:
    """The lead's acceptance targets, read off this run's medians (float64)."""
    rs = [r for r in results if r["dtype"] == dtype]
    targets = []

    def add(name, met, detail, measured):
        targets.append({"target": name, "met": met, "detail": detail, "measured": measured})

    # 1. v&g <= 1.3 x value at N >= 10^4, every fused kernel
    m = [(r["case"], r["n"], r["ratios"]["fused_vg_over_value"]) for r in rs if r["n"] >= 10**4]
    if m:
        floor = {(r["case"], r["n"]): r["ratios"]["floor_vg_over_value"] for r in rs}
        bad = [x for x in m if x[2] > 1.3]
        worst = max(m, key=lambda x: x[2])
        add("fused v&g <= 1.3 x fused value, N >= 1e4", not bad,
            f"worst {worst[0]} N={worst[1]:.0e}: {worst[2]:.3g}"
            + ("; over 1.3 (floor = value + one N-array write, same run): "
               + ", ".join(f"{c} {n:.0e} ({x:.3g}, floor {floor[c, n]:.3g})"
                           for c, n, x in bad) if bad else ""),
            [{"case": c, "n": n, "ratio": x, "floor": floor[c, n]} for c, n, x in m])
    # 2. fused never slower than jax autodiff beyond noise (every baseline, value / grad /
    # v&g), with this run's A/A pairs (a baseline against its second compilation) first
    aa = [(r["case"], kind, r["n"], r["ratios"][f"aa_{kind}"])
          for r in rs for kind in KINDS]
    if aa:
        out = [x for x in aa if abs(x[3] - 1) > NOISE]
        add("A/A noise: autodiff timed against a second compilation of itself", None,
            "; ".join(f"{kind} {min(x[3] for x in aa if x[1] == kind):.2f}-"
                      f"{max(x[3] for x in aa if x[1] == kind):.2f}" for kind in KINDS)
            + f" over {len(aa) // len(KINDS)} sizes x kernels; outside 1 +- {NOISE:.2f}: "
            + (", ".join(f"{c} {k} {n:.0e} ({x:.2f})" for c, k, n, x in out) or "none"),
            [{"case": c, "kind": k, "n": n, "ratio": x} for c, k, n, x in aa])
    m = []
    for r in rs:
        for b in r["baselines"]:
            for kind in KINDS:
                m.append((r["case"], b, kind, r["n"], r["ratios"][f"{b}_{kind}_over_fused_{kind}"]))
    if m:
        for kind in KINDS:
            mk = [x for x in m if x[2] == kind]
            bad = [x for x in mk if x[4] < 1 - NOISE]
            below = sum(1 for x in mk if x[4] < 1)
            worst = min(mk, key=lambda x: x[4])
            add(f"fused {kind} never slower than autodiff {kind} beyond noise ({NOISE:.0%})",
                not bad,
                f"worst autodiff/fused = {worst[4]:.3g} "
                f"({worst[0]} vs {worst[1]}, N={worst[3]:.0e}); {below} of {len(mk)} below 1"
                + (f", {len(bad)} below {1 - NOISE:.2f}: "
                   + ", ".join(f"{c}[{b}] {n:.0e} ({x:.3g})" for c, b, _, n, x in bad)
                   if bad else ""),
                [{"case": c, "baseline": b, "n": n, "ratio": x} for c, b, _, n, x in mk])
    # 3. normal v&g within 1.5 x numba at 1e6 and 1e7
    m = [(r["n"], r["ratios"]["fused_vg_over_numba_vg"]) for r in rs
         if r["case"] == "normal" and r["n"] in (10**6, 10**7)]
    if m:
        add("normal v&g <= 1.5 x numba v&g at N = 1e6, 1e7", all(x <= 1.5 for _, x in m),
            ", ".join(f"N={n:.0e}: fused/numba = {x:.3g}" for n, x in m),
            [{"n": n, "ratio": x} for n, x in m])
    # 4. Poisson propto / log-rate v&g >= 5 x faster than autodiff of stats.poisson.logpmf, 1e6
    m = [(r["case"], r["ratios"]["stats_vg_over_fused_vg"]) for r in rs
         if r["n"] == 10**6
         and r["case"] in ("poisson_propto", "poisson_log", "poisson_log_propto")]
    if m:
        add("poisson(normalized=False) and poisson_log v&g >= 5 x faster than autodiff of "
            "jax.scipy.stats.poisson.logpmf at N = 1e6", all(x >= 5 for _, x in m),
            ", ".join(f"{c}: {x:.3g}x" for c, x in m), [{"case": c, "ratio": x} for c, x in m])
    return targets


# =============================================================================== CLI


def parse_sizes(max_n: float, quick: bool, min_n: float = 10) -> list[int]:
    top = min(float(max_n), 1e4) if quick else float(max_n)
    sizes = []
    n = int(min_n)
    while n <= top * (1 + 1e-9):
        sizes.append(n)
        n *= 10
    return sizes


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true",
                   help="N = 10 .. 10^4 and few repeats (well under a minute)")
    _timing.add_json_argument(p, "kernels.json")
    p.add_argument("--kernels", default=",".join(FAMILIES),
                   help=f"comma-separated subset of {','.join(FAMILIES)} (default: all)")
    p.add_argument("--dtypes", default="float64,float32", help="comma-separated list of float64, float32 (default: float64,float32)")
    p.add_argument("--max-n", type=float, default=1e7, help="largest N (default 1e7)")
    p.add_argument("--min-n", type=float, default=10, help="smallest N (default 10)")
    p.add_argument("--async-dispatch", action="store_true",
                   help="keep JAX's default asynchronous CPU dispatch (default here: off, so "
                        "that small-N times measure the kernel, not a host-thread hand-off)")
    p.add_argument("--min-time", type=float, default=None,
                   help="seconds of timed calls per variant and size (default 0.2; quick 0.02)")


def main(args) -> int:
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_enable_async_dispatch", bool(args.async_dispatch))
    families = [f.strip() for f in args.kernels.split(",") if f.strip()]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise SystemExit(f"unknown kernel(s) {unknown}; choose from {','.join(FAMILIES)}")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in dtypes:
        if d not in ("float64", "float32"):
            raise SystemExit(f"unknown dtype {d!r}; choose float64 and/or float32")
    cfg = Config(sizes=parse_sizes(args.max_n, args.quick, args.min_n), dtypes=dtypes,
                 families=families, quick=args.quick, async_dispatch=args.async_dispatch)
    if args.quick:
        cfg.min_repeats, cfg.min_total, cfg.max_total = 5, 0.02, 0.1
    if args.min_time is not None:
        cfg.min_total = args.min_time
        cfg.max_total = max(cfg.max_total, args.min_time)

    cases = [c for c in _cases() if c.family in families]
    machine = _timing.machine_info()
    log = partial(print, file=sys.stderr, flush=True)
    log(f"# kernel benchmark on {machine['cpu_model']} ({machine['cpu_count']} cores), "
        f"jax {machine['jax']} {machine['backend']}, numba {machine.get('numba')}")
    log(f"# sizes {cfg.sizes}, dtypes {dtypes}, cases {[c.key for c in cases]}")
    t_start = time.perf_counter()
    results = []
    for case in cases:
        for dtype in dtypes:
            for n in cfg.sizes:
                t0 = time.perf_counter()
                r = bench_one(case, dtype, n, cfg)
                results.append(r)
                b0 = r["baselines"][0]
                log(f"  {case.key:20s} {dtype} N={n:<9d} "
                    f"fused v&g {fmt_us(r['variants']['fused.vg']['median']):>8s} µs"
                    f"  v&g/value {r['ratios']['fused_vg_over_value']:.2f}"
                    f"  {b0}/fused {r['ratios'][b0 + '_vg_over_fused_vg']:.2f}"
                    f"  fused/numba {r['ratios']['fused_vg_over_numba_vg']:.2f}"
                    f"  ({time.perf_counter() - t0:.1f} s)")
    wall = time.perf_counter() - t_start

    text = tables(results, cases)
    targets = evaluate_targets(results) if "float64" in dtypes else []
    print("## fusedlp kernel benchmark\n")
    print(f"{machine['date']}: {machine['cpu_model']}, {machine['cpu_count']} cores "
          f"({machine['platform']}); jax/jaxlib {machine['jax']}/{machine['jaxlib']} "
          f"({machine['backend']}), numba {machine.get('numba')}. Wall time {wall:.0f} s.\n")
    print(text)
    print(_timing.targets_md(targets, "Targets (float64, this run)"))

    if args.json:
        _timing.write_json(args.json, {
            "benchmark": "fusedlp kernels",
            "machine": machine,
            "config": {**cfg.__dict__},
            "method": ("jax: jit, AOT lower+compile timed separately, block_until_ready in "
                       "each timed call (not for numba, whose outputs are ready on "
                       "return); all variants of one (kernel, dtype, N) timed "
                       "round-robin, in a random order each round; per-call seconds; "
                       "median reported, min/IQR kept"),
            "results": results,
            "targets_float64": targets,
        }, wall)
        log(f"# wrote {args.json} ({wall:.0f} s)")
    return 0
