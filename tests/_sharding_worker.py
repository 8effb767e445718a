"""Sharding checks on four forced CPU devices, run by test_sharding.py in a subprocess.

The pytest process has one device and x64 already on (conftest.py); the device count is
fixed when jax initialises its backend, so these checks need a fresh interpreter started
with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``. Each check records
``{"group", "name", "ok", "detail"}``; the whole list is printed as JSON on the last line of
stdout, and test_sharding.py asserts on it group by group. A check that raises is recorded
as failed with its traceback, so one broken kernel does not hide the others.

Run by hand: ``XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_ENABLE_X64=1 python
tests/_sharding_worker.py``. With ``--process ID COUNT PORT`` (and two devices per process)
it is instead one process of a ``jax.distributed`` run: see :func:`multiprocess_fit`.
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import fusedlp
from fusedlp import fitting
from fusedlp.sharding import data_mesh, shard

N_DEVICES = 4
N_EVEN = 4 * 2600  # 10400: above normal's 8192-element threshold, so its lax.cond runs
N_UNEVEN = 10403  # padded to 10404 on 4 devices
HALF_LOG_2PI = 0.5 * float(np.log(2.0 * np.pi))

# Tolerances of sharded against unsharded, by dtype (the shape of conftest.TOL). Both sides
# compute the same elements; only the order of the sums differs, so the relative error of a
# sum is bounded by a few eps times (sum of |terms|) / |sum|: `value` and `grad` are
# relative to that magnitude (`mag` below). Elementwise gradients agree to rounding.
TOL = {
    np.dtype(np.float64): {"value": 1e-12, "grad": 1e-11},
    np.dtype(np.float32): {"value": 2e-6, "grad": 2e-5},
}

# collectives that move data between devices; an all-reduce of a few scalars is expected
DATA_MOVING = ("all-gather", "all-to-all", "collective-permute", "reduce-scatter")
MAX_REDUCED_ELEMENTS = 64  # all-reduces must carry sums (scalars, parameters), not data

RESULTS: list[dict] = []


def record(group: str, name: str):
    """``record(group, name)(check, *args)`` runs one check and records its verdict."""

    def run(fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            detail, ok = fn(*args, **kwargs) or "", True
        except Exception as err:  # noqa: BLE001 - every failure is reported, not raised
            detail, ok = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=6)}", False
        RESULTS.append({"group": group, "name": name, "ok": ok, "detail": detail,
                        "seconds": round(time.perf_counter() - t0, 2)})

    return run


# ================================================================== HLO inspection


def collectives(hlo: str) -> dict:
    """Collective ops of a compiled HLO module, and the element count of each all-reduce."""
    moving = sorted({op for op in DATA_MOVING if re.search(rf"\b{op}(-start)?\(", hlo)})
    sizes = []
    for line in hlo.splitlines():
        m = re.search(r"=\s*(.*?)\s+all-reduce(?:-start)?\(", line)
        if not m:
            continue
        shapes = re.findall(r"[a-z]+\d*\[([\d,]*)\]", m.group(1))
        sizes.append(sum(int(np.prod([int(d) for d in s.split(",") if d] or [1]))
                         for s in shapes))
    return {"moving": moving, "all_reduce_sizes": sizes}


def assert_reduces_without_gather(jitted, *args) -> str:
    """The compiled program reduces across devices and moves no data-sized array."""
    hlo = jitted.lower(*args).compile().as_text()
    c = collectives(hlo)
    assert not c["moving"], f"data-moving collectives in the compiled HLO: {c['moving']}"
    assert c["all_reduce_sizes"], "no all-reduce in the compiled HLO: nothing crosses devices?"
    big = [s for s in c["all_reduce_sizes"] if s > MAX_REDUCED_ELEMENTS]
    assert not big, f"all-reduce of data-sized arrays ({big} elements): a gather in disguise"
    return f"all-reduce element counts {c['all_reduce_sizes']}"


# ====================================================================== kernel cases


def _data(n: int, dtype):
    rng = np.random.default_rng(n)
    dt = np.dtype(dtype).type
    x = rng.normal(0.0, 1.0, n).astype(dt)
    eta = rng.normal(0.2, 0.4, n).astype(dt)
    k = rng.poisson(np.exp(eta.astype(np.float64))).astype(np.int32)
    sites = n // 8 if n % 8 == 0 else n  # eam: (sites, 8 neighbours)
    r = rng.uniform(0.1, 2.0, (sites, 8)).astype(dt)
    mask = rng.uniform(size=(sites, 8)) < 0.8
    trials = k + rng.integers(0, 4, n).astype(np.int32)  # drawn last: the rest is unchanged
    return {"x": x, "eta": eta, "k": k, "rate": np.exp(eta).astype(dt), "r": r, "mask": mask,
            "loc": dt(0.3), "scale": dt(1.2), "A": dt(0.05), "beta": dt(3.0),
            "trials": trials, "y": (k > 1).astype(np.int32), "df": dt(4.0),
            "concentration": dt(2.5), "alpha": dt(2.0)}


def kernel_cases():
    """name -> (f(*args, valid=None), keys of the args in `_data`, differentiated argnums).

    Given the mask ``valid`` of a padded call, ``f`` makes the padding contribute exactly
    nothing, by the rules of fusedlp.sharding's module docstring.
    """
    def eam(r, A, beta, mask=None):
        return fusedlp.eam_energy(r, density=(A, beta), mask=mask)

    def normal_scalar(x, loc, scale, valid=None):
        if valid is None:
            return fusedlp.normal_lpdf(x, loc, scale)
        # z = 0 on the padding; each padded element adds -log(scale) - log(2 pi)/2: add back
        return (fusedlp.normal_lpdf(x, jnp.where(valid, loc, 0.0), scale)
                + jnp.sum(~valid) * (jnp.log(scale) + HALF_LOG_2PI))

    def normal_regression(x, loc_vec, scale, valid=None):  # array loc, scalar scale
        return normal_scalar(x, loc_vec, scale, valid)

    def normal_arrays(x, loc_vec, scale_vec, valid=None):
        if valid is None:
            return fusedlp.normal_lpdf(x, loc_vec, scale_vec, normalized=False)
        return fusedlp.normal_lpdf(x, jnp.where(valid, loc_vec, 0.0),
                                   jnp.where(valid, scale_vec, 1.0), normalized=False)

    def poisson(normalized):
        def f(k, rate, valid=None):
            if valid is not None:
                rate = jnp.where(valid, rate, 0.0)
            return fusedlp.poisson_lpmf(k, rate, normalized=normalized)
        return f

    def poisson_log(normalized):
        def f(k, eta, valid=None):
            if valid is not None:
                eta = jnp.where(valid, eta, -jnp.inf)
            return fusedlp.poisson_log_lpmf(k, eta, normalized=normalized)
        return f

    def eam_masked(r, mask, A, beta, valid=None):
        if valid is not None:
            mask = mask & valid[:, None]
        return eam(r, A, beta, mask)

    def eam_plain(r, A, beta, valid=None):
        mask = None if valid is None else jnp.broadcast_to(valid[:, None], r.shape)
        return eam(r, A, beta, mask)

    return {
        "normal(x; scalar loc, scale) d/dx,dloc,dscale":
            (normal_scalar, ("x", "loc", "scale"), (0, 1, 2)),
        "normal(x; array loc, scalar scale) d/dloc,dscale":
            (normal_regression, ("x", "eta", "scale"), (1, 2)),
        "normal(x; array loc, array scale, propto) d/dx,dloc,dscale":
            (normal_arrays, ("x", "eta", "rate"), (0, 1, 2)),
        "poisson_lpmf d/drate": (poisson(True), ("k", "rate"), (1,)),
        "poisson_lpmf(propto) d/drate": (poisson(False), ("k", "rate"), (1,)),
        "poisson_log_lpmf d/deta": (poisson_log(True), ("k", "eta"), (1,)),
        "poisson_log_lpmf(propto) d/deta": (poisson_log(False), ("k", "eta"), (1,)),
        "eam_energy d/dr,dA,dbeta": (eam_plain, ("r", "A", "beta"), (0, 1, 2)),
        "eam_energy(mask) d/dr,dA,dbeta": (eam_masked, ("r", "mask", "A", "beta"), (0, 2, 3)),
    }


def fused_kernel_cases():
    """The kernels built with fusedlp.fuse (its vmap over the elements; log k! a table
    lookup in negative_binomial and binomial): name -> (f, keys, argnums), unpadded only."""
    return {
        "negative_binomial_lpmf d/dmean,dconcentration":
            (fusedlp.negative_binomial_lpmf, ("k", "rate", "concentration"), (1, 2)),
        "negative_binomial_lpmf(array concentration) d/dmean,dconcentration":
            (fusedlp.negative_binomial_lpmf, ("k", "rate", "rate"), (1, 2)),
        "binomial_logit_lpmf d/dlogit": (fusedlp.binomial_logit_lpmf, ("k", "trials", "eta"), (2,)),
        "bernoulli_logit_lpmf d/dlogit": (fusedlp.bernoulli_logit_lpmf, ("y", "eta"), (1,)),
        "student_t_lpdf d/dx,ddf,dloc,dscale":
            (fusedlp.student_t_lpdf, ("x", "df", "loc", "scale"), (0, 1, 2, 3)),
        "gamma_lpdf d/dx,dshape,drate": (fusedlp.gamma_lpdf, ("rate", "alpha", "beta"), (0, 1, 2)),
    }


def magnitude(fn, args, argnums) -> tuple[float, list[float]]:
    """Sum over observations of |term|, for the value and for each scalar's partial.

    The conditioning of a float sum: the kernels return sums, so sharded and unsharded
    differ by the order of summation, by a few eps times this (conftest.TOL's convention).
    Terms come from vmapping the kernel over the observations (axis 0), in float64.
    """
    args64 = [np.asarray(a, np.float64) if np.issubdtype(np.asarray(a).dtype, np.floating)
              else np.asarray(a) for a in args]
    axes = [0 if np.ndim(a) else None for a in args64]
    terms, partials = jax.jit(jax.vmap(jax.value_and_grad(fn, argnums=argnums),
                                       in_axes=axes))(*args64)
    return float(np.sum(np.abs(terms))), [float(np.sum(np.abs(p))) for p in partials]


def _close(got, want, rtol, scale, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want)
    bound = rtol * (np.abs(want) + scale)
    bad = ~(err <= bound)  # NaN fails
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.size} differ; worst |got - want| = "
        f"{float(np.nanmax(err)):.3g} (bound {float(bound.flat[int(np.nanargmax(err))]):.3g})")


def check_kernel(name, fn, keys, argnums, n, dtype, mesh, pad):
    tol = TOL[np.dtype(dtype)]
    d = _data(n, dtype)
    args = [d[k] for k in keys]
    vg = jax.jit(jax.value_and_grad(fn, argnums=argnums))
    want_v, want_g = vg(*args)
    mag_value, mag_grads = magnitude(fn, args, argnums)
    if pad:
        sharded, valid = shard(tuple(args), mesh, pad=True)
        sharded_args = (*sharded, valid)
    else:
        sharded = sharded_args = shard(tuple(args), mesh)
    hlo_vg = assert_reduces_without_gather(vg, *sharded_args)  # compiles vg for these
    got_v, got_g = vg(*sharded_args)
    _close(got_v, want_v, tol["value"], mag_value, "value")
    for i, g_got, g_want, mag in zip(argnums, got_g, want_g, mag_grads):
        g_got = np.asarray(g_got)
        if pad and np.ndim(g_want) > 0:  # the padding's cotangents are exactly zero
            tail = g_got[np.shape(g_want)[0]:]
            assert np.all(tail == 0), f"d/d{keys[i]}: non-zero cotangent on the padding"
            g_got = g_got[: np.shape(g_want)[0]]
        # elementwise partials are compared to themselves, sums to their |terms|
        _close(g_got, g_want, tol["grad"], 0.0 if np.ndim(g_want) else mag, f"d/d{keys[i]}")
    # cotangents keep their input's sharding; scalars come back replicated
    for i, g in zip(argnums, got_g):
        x = sharded[i]
        if x.ndim:
            assert g.sharding.is_equivalent_to(x.sharding, x.ndim), (
                f"d/d{keys[i]} sharding {g.sharding} != input's {x.sharding}")
        else:
            assert g.sharding.is_fully_replicated, f"d/d{keys[i]} not replicated: {g.sharding}"
    hlo_v = assert_reduces_without_gather(jax.jit(fn), *sharded_args)
    return (f"value {float(got_v):.10g} (unsharded {float(want_v):.10g}); "
            f"HLO value: {hlo_v}; value-and-grad: {hlo_vg}")


def check_fused_hessian(mesh):
    """fuse's rules transpose too on an Explicit mesh: fusedlp.hessian (reverse over reverse)
    of a fuse-built kernel in its scalar parameters, sharded against unsharded."""
    d = _data(400, np.float64)

    def f(theta, k, mean):
        return fusedlp.negative_binomial_lpmf(k, theta[0] * mean, theta[1])

    theta = np.array([1.1, 2.5])
    want = fusedlp.hessian(f)(theta, d["k"], d["rate"])
    got = jax.jit(fusedlp.hessian(f))(theta, *shard((d["k"], d["rate"]), mesh))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10)
    return f"hessian {np.asarray(got).tolist()}"


def check_eager_grad_sharding(mesh):
    """Outside jit too: the cotangent of a sharded array is sharded like it."""
    x = shard(np.linspace(-1.0, 1.0, 16), mesh)
    g = jax.grad(fusedlp.normal_lpdf)(x, 0.3, 1.2)
    assert g.sharding.is_equivalent_to(x.sharding, 1), f"{g.sharding} != {x.sharding}"
    eta = shard(np.zeros(16), mesh)
    g = jax.grad(fusedlp.poisson_log_lpmf, argnums=1)(np.arange(16) % 3, eta)
    assert g.sharding.is_equivalent_to(eta.sharding, 1), f"{g.sharding} != {eta.sharding}"
    return str(g.sharding)


def check_eager_fuse_kernels_on_sharded_data(mesh):
    """Concrete data already on the devices (no jax.set_mesh) into the fuse kernels whose
    data-only part is summed at trace time for concrete data: equal to the unsharded call
    (that part stays per element for data spread over devices)."""
    d = _data(N_EVEN, np.float64)
    k, t = np.minimum(d["k"], d["trials"]), d["trials"]
    calls = {"negative_binomial_lpmf": ((d["k"], d["rate"]), (2.5,)),
             "binomial_logit_lpmf": ((k, t, d["eta"]), ())}
    for name, (arrays, scalars) in calls.items():
        f = getattr(fusedlp, name)
        np.testing.assert_allclose(float(f(*shard(arrays, mesh), *scalars)),
                                   float(f(*arrays, *scalars)), rtol=1e-12, err_msg=name)
    return ", ".join(calls)


def check_vmapped_members_on_explicit_mesh(mesh):
    """A vmapped batch of problems whose members are split over an Explicit mesh: the
    kernels that look up log k! in a table (the Poisson kernels' and the negative
    binomial's, a gather) name the output's sharding there too, and give what the
    unsharded batch gives."""
    rng = np.random.default_rng(5)
    b, n = 4 * N_DEVICES, 40
    k = rng.poisson(3.0, (b, n)).astype(np.float64)
    eta = rng.normal(0.5, 0.3, (b, n))
    calls = {"poisson_log_lpmf": lambda k, e: fusedlp.poisson_log_lpmf(k, e),
             "poisson_lpmf": lambda k, e: fusedlp.poisson_lpmf(k, jnp.exp(e)),
             "negative_binomial_lpmf": lambda k, e: fusedlp.negative_binomial_lpmf(
                 k, jnp.exp(e), 2.5)}
    split = NamedSharding(mesh, P("data"))
    for name, f in calls.items():
        vg = jax.jit(jax.vmap(jax.value_and_grad(f, argnums=1)))
        want = vg(k, eta)
        with jax.set_mesh(mesh):
            got = vg(jax.device_put(k, split), jax.device_put(eta, split))
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12,
                                       err_msg=name)
    return ", ".join(calls)


def check_pointwise_on_explicit_mesh(mesh):
    """fusedlp.pointwise on data split over an Explicit mesh, with a scalar parameter
    broadcast to them: the terms keep the data's sharding and equal the unsharded ones,
    eagerly and under jit (vmap refused the mismatched specs of the broadcast scalar, and
    under jit a batch this large lost the mesh in jax's batching of a custom_jvp)."""
    d = _data(N_EVEN, np.float64)
    k = d["k"]
    # a hand-written kernel and a fuse-built one (all eight passed by hand; CI's time is short)
    calls = {"poisson_lpmf": (k, 2.0), "negative_binomial_lpmf": (k, d["rate"], 2.5)}
    for name, args in calls.items():
        f = getattr(fusedlp, name)
        want = np.asarray(fusedlp.pointwise(f, *args))
        split = [shard(a, mesh) if np.ndim(a) else a for a in args]
        for how, g in (("eager", fusedlp.pointwise),
                       ("jit", jax.jit(fusedlp.pointwise, static_argnums=0))):
            got = g(f, *split)
            assert jax.typeof(got).sharding.spec == P("data"), (name, how)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13,
                                       err_msg=f"{name} {how}")
    return ", ".join(calls)


def check_detector_catches_gather(mesh):
    """Mutation check of the HLO test: a kernel fed a gathered (replicated) copy must fail."""
    x = shard(np.linspace(-1.0, 1.0, 1024), mesh)
    everywhere = NamedSharding(mesh, P())

    def gathered(x):
        return fusedlp.normal_lpdf(jax.lax.with_sharding_constraint(x, everywhere), 0.3, 1.2)

    try:
        assert_reduces_without_gather(jax.jit(jax.value_and_grad(gathered)), x)
    except AssertionError as err:
        assert "all-gather" in str(err), err
        return f"detected: {err}"
    raise AssertionError("the HLO check passed a program that gathers the data")


# ============================================================================ helper


def check_shard_helper(mesh):
    X = np.arange(30.0).reshape(10, 3)
    k = np.arange(10) % 3
    (Xs, ks), valid = shard((X, k), mesh, pad=True)
    assert Xs.shape == (12, 3) and ks.shape == (12,) and valid.shape == (12,)
    np.testing.assert_array_equal(np.asarray(Xs)[:10], X)
    np.testing.assert_array_equal(np.asarray(Xs)[10:], 0.0)
    np.testing.assert_array_equal(np.asarray(valid), np.arange(12) < 10)
    for a in (Xs, ks, valid):
        assert a.sharding.spec[0] == "data", a.sharding
        assert len({s.device for s in a.addressable_shards}) == N_DEVICES
        assert all(s.data.shape[0] == 3 for s in a.addressable_shards)
    try:
        shard((X, k), mesh)
    except ValueError as err:
        assert "pad=True" in str(err) and "data[0]" in str(err), err
    else:
        raise AssertionError("uneven data without pad=True did not raise")
    try:
        shard((X, k[:9]), mesh, pad=True)
    except ValueError as err:
        assert "same length" in str(err), err
    else:
        raise AssertionError("leaves of different lengths did not raise")
    tree = shard({"y": np.ones(8), "s": np.float64(2.0), "c": 3.0}, mesh)
    assert tree["y"].sharding.spec[0] == "data" and tree["s"].sharding.is_fully_replicated
    assert tree["c"] == 3.0
    r = shard(np.ones((2, 8)), mesh, axis=1)  # observations along axis 1
    assert r.sharding.spec == P(None, "data"), r.sharding
    jx = shard(jnp.arange(10.0), mesh, pad=True)[0]  # a jax array is padded on device
    np.testing.assert_array_equal(np.asarray(jx), np.r_[np.arange(10.0), 0.0, 0.0])
    return "pad, mask, errors, pytrees, axis=1, jax input"


# =============================================================================== fit


def poisson_regression(params, X, k):
    return fusedlp.poisson_log_lpmf(k, X @ params["beta"])


def poisson_regression_padded(params, X, k, valid):
    return fusedlp.poisson_log_lpmf(k, jnp.where(valid, X @ params["beta"], -jnp.inf))


def _regression_data(n):
    rng = np.random.default_rng(7)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))])
    k = rng.poisson(np.exp(X @ np.array([0.5, -0.3, 0.2])))
    return X, k


def _fits_equal(got, want):
    assert int(got.status) == int(want.status) == fusedlp.FitStatus.CONVERGED, (
        f"status {int(got.status)} vs {int(want.status)}")
    assert int(got.num_steps) == int(want.num_steps), (
        f"steps {int(got.num_steps)} vs {int(want.num_steps)}")
    np.testing.assert_allclose(got.params["beta"], want.params["beta"], rtol=1e-9)
    np.testing.assert_allclose(got.value, want.value, rtol=1e-12)
    assert got.params["beta"].sharding.is_fully_replicated


def check_fit(mesh, n, explicit=False):
    X, k = _regression_data(n)
    init = {"beta": jnp.zeros(3)}
    want = fusedlp.fit(poisson_regression, init, X, k)
    if n % N_DEVICES:
        (Xs, ks), valid = shard((X, k), mesh, pad=True)
        objective, data = poisson_regression_padded, (Xs, ks, valid)
    else:
        objective, data = poisson_regression, shard((X, k), mesh)
    if explicit:  # Explicit axes: jax asks for the mesh in context to transpose X @ beta
        with jax.set_mesh(mesh):
            got = fusedlp.fit(objective, init, *data)
        hlo = "not inspected"
    else:
        # fit's own compiled loop, lowered with the arguments fit passes it (so that the
        # fit below reuses this compilation)
        hlo = assert_reduces_without_gather(
            _FitLoop(objective), init, data)
        got = fusedlp.fit(objective, init, *data)
    _fits_equal(got, want)
    return (f"beta {np.asarray(got.params['beta']).round(6).tolist()}, "
            f"{int(got.num_steps)} steps; HLO {hlo}")


class _FitLoop:
    """``fitting._fit_loop`` with fit's default settings bound, lowerable like a jit."""

    def __init__(self, objective):
        self.objective = objective

    def lower(self, params, data):
        optimizer = fitting._resolve_optimizer(None, params)  # Newton, for 3 parameters
        tol = fitting._default_newton_tol(np.float64)
        return fitting._fit_loop.lower(self.objective, optimizer, True, 1000,
                                       0, False, params, tuple(data), tol, tol)


def check_fit_validation_on_devices(mesh):
    """fit's data check runs on the devices for sharded data, and still names the entry."""
    X, k = _regression_data(4000)
    X[1234, 1] = np.nan
    Xs, ks = shard((X, k), mesh)
    try:
        fusedlp.fit(poisson_regression, {"beta": jnp.zeros(3)}, Xs, ks)
    except ValueError as err:
        assert "data[0]" in str(err) and "(1234, 1)" in str(err), err
        return str(err)
    raise AssertionError("NaN in sharded data did not raise")


# ===================================================================== two processes


def multiprocess_fit(process_id: int, num_processes: int, port: int) -> dict:
    """One process of a ``jax.distributed`` run (2 CPU devices each), as in the README.

    Fits the padded Poisson regression twice: (A) every process passes the full data to
    ``fusedlp.shard``, which copies only this process's blocks; (B) each process holds only
    its own rows and the global arrays are made with
    ``jax.make_array_from_process_local_data``.
    """
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=num_processes, process_id=process_id)
    try:
        mesh = data_mesh()
        X, k = _regression_data(4003)
        n, init = X.shape[0], {"beta": jnp.zeros(3)}
        (Xs, ks), valid = shard((X, k), mesh, pad=True)
        a = fusedlp.fit(poisson_regression_padded, init, Xs, ks, valid)
        # B: rows [lo, hi) here, padded to a common length that the local devices divide
        local_devices = jax.local_device_count()
        per = -(-n // num_processes)
        per = -(-per // local_devices) * local_devices
        lo, hi = process_id * per, min((process_id + 1) * per, n)

        def mine(x):
            out = np.zeros((per, *x.shape[1:]), x.dtype)
            out[: hi - lo] = x[lo:hi]
            return out

        rows = NamedSharding(mesh, P("data"))
        Xg, kg, vg = (jax.make_array_from_process_local_data(rows, mine(x))
                      for x in (X, k, np.ones(n, bool)))
        b = fusedlp.fit(poisson_regression_padded, init, Xg, kg, vg)
        return {name: {"beta": np.asarray(r.params["beta"]).tolist(),
                       "value": float(r.value), "num_steps": int(r.num_steps),
                       "status": int(r.status)} for name, r in (("A", a), ("B", b))} | {
            "devices": jax.device_count(), "local_devices": local_devices}
    finally:
        jax.distributed.shutdown()


# ============================================================================== main


def main() -> int:
    assert jax.device_count() == N_DEVICES, (
        f"expected {N_DEVICES} devices (XLA_FLAGS), got {jax.devices()}")
    auto = data_mesh()
    explicit = jax.make_mesh((N_DEVICES,), ("data",),
                             axis_types=(jax.sharding.AxisType.Explicit,))
    record("helper", "shard pads, masks and places")(check_shard_helper, auto)
    for dtype in (np.float64, np.float32):
        for name, (fn, keys, argnums) in kernel_cases().items():
            for n, pad in ((N_EVEN, False), (N_UNEVEN, True)):
                label = f"{name} {np.dtype(dtype).name} N={n}{' padded' if pad else ''}"
                record("kernels", label)(check_kernel, name, fn, keys, argnums, n, dtype,
                                         auto, pad)
    for name, (fn, keys, argnums) in fused_kernel_cases().items():
        record("kernels", f"{name} float64 N={N_EVEN}")(
            check_kernel, name, fn, keys, argnums, N_EVEN, np.float64, auto, False)
    for name, (fn, keys, argnums) in (kernel_cases() | fused_kernel_cases()).items():
        label = f"{name} float64 N={N_EVEN} Explicit mesh"
        record("explicit", label)(
            lambda *a: _in_mesh(explicit, check_kernel, *a), name, fn, keys, argnums, N_EVEN,
            np.float64, explicit, False)
    record("explicit", "fusedlp.hessian of negative_binomial_lpmf, Explicit mesh")(
        _in_mesh, explicit, check_fused_hessian, explicit)
    record("explicit", "vmapped members split over an Explicit mesh")(
        check_vmapped_members_on_explicit_mesh, explicit)
    record("explicit", "pointwise on split data with a broadcast scalar")(
        _in_mesh, explicit, check_pointwise_on_explicit_mesh, explicit)
    record("cotangents", "eager grad keeps the input's sharding")(
        check_eager_grad_sharding, auto)
    record("explicit", "eager fuse kernels on concrete sharded data, no set_mesh")(
        check_eager_fuse_kernels_on_sharded_data, explicit)
    record("hlo", "the HLO check fails on a program that gathers")(
        check_detector_catches_gather, auto)
    record("fit", "poisson regression N=4000")(check_fit, auto, 4000)
    record("fit", "poisson regression N=4003 padded")(check_fit, auto, 4003)
    record("fit", "poisson regression N=4000 Explicit mesh")(
        check_fit, explicit, 4000, explicit=True)
    record("fit", "NaN in sharded data raises naming the entry")(
        check_fit_validation_on_devices, auto)
    print(json.dumps(RESULTS))
    return 0


def _in_mesh(mesh, fn, *args):
    with jax.set_mesh(mesh):
        return fn(*args)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--process":
        print(json.dumps(multiprocess_fit(*map(int, sys.argv[2:]))))
        sys.exit(0)
    sys.exit(main())
