"""The fuse-built kernels beyond the contract of test_contract.py.

student_t_lpdf, gamma_lpdf, negative_binomial_lpmf, bernoulli_logit_lpmf and
binomial_logit_lpmf: their values against scipy.stats, gradients against autodiff of the plain
formula and finite differences are rows of test_contract.py's harness. Here: hessian,
support edges, invalid parameters -> NaN, data out of support -> -inf with zero gradient,
empty inputs, validation, trace-time errors, symbolic zeros, no retracing.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import chex
import jax
import jax.extend.core
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import pytest
import scipy.special as sps
import scipy.stats as ss
from _helpers import assert_close, grad_primitive_counts

import fusedlp

NAN, INF = float("nan"), float("inf")


def as64(a):
    a = np.asarray(a)
    return a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fused: Callable
    plain_terms: Callable  # jnp args -> elementwise log-density (plain formula)
    make: Callable  # (rng, shapes, dtype) -> args
    diff: tuple[int, ...]
    shapes: tuple


def _student_make(rng, shapes, dtype):
    xs, ds, ls, ss_ = shapes
    x = rng.standard_t(3.0, xs) * 2.0
    if x.size:
        x.flat[0] = 40.0  # far in the tail
    return tuple(np.asarray(a, dtype) for a in (x, rng.uniform(0.5, 30.0, ds),
                                                rng.normal(0, 1, ls), rng.uniform(0.3, 3.0, ss_)))


def _student_plain(x, df, loc, scale):
    z = (x - loc) / scale
    return (jsp.gammaln((df + 1) / 2) - jsp.gammaln(df / 2) - 0.5 * jnp.log(df * jnp.pi)
            - jnp.log(scale) - (df + 1) / 2 * jnp.log1p(z * z / df))


def _gamma_make(rng, shapes, dtype):
    xs, as_, rs = shapes
    return tuple(np.asarray(a, dtype) for a in (rng.gamma(2.0, 1.0, xs) + 1e-3,
                                                rng.uniform(0.3, 8.0, as_),
                                                rng.uniform(0.2, 5.0, rs)))


def _gamma_plain(x, shape, rate):
    return shape * jnp.log(rate) - jsp.gammaln(shape) + (shape - 1) * jnp.log(x) - rate * x


def _counts(rng, shape, hi=40):
    k = rng.integers(0, hi, shape)
    if k.size >= 2:
        k.flat[:2] = [0, 150]
    return k.astype(np.int32)


def _nb_make(rng, shapes, dtype):
    ks, ms, cs = shapes
    return (_counts(rng, ks), np.asarray(rng.uniform(0.1, 50.0, ms), dtype),
            np.asarray(rng.uniform(0.2, 20.0, cs), dtype))


def _nb_plain(k, mean, phi):
    k = k.astype(mean.dtype)
    return (jsp.gammaln(k + phi) - jsp.gammaln(phi) - jsp.gammaln(k + 1.0)
            + k * jnp.log(mean) - k * jnp.log(mean + phi) + phi * jnp.log(phi / (mean + phi)))


def _bern_make(rng, shapes, dtype):
    ys, ls = shapes
    return rng.integers(0, 2, ys).astype(np.int32), np.asarray(rng.normal(0, 3, ls), dtype)


def _bern_plain(y, eta):
    return y.astype(eta.dtype) * eta - jax.nn.softplus(eta)


def _binom_make(rng, shapes, dtype):
    ks, ns, ls = shapes
    n = rng.integers(5, 30, ns)
    k = rng.integers(0, int(np.min(n, initial=5)) + 1, ks)  # k <= n after broadcasting
    return k.astype(np.int32), n.astype(np.int32), np.asarray(rng.normal(0, 2, ls), dtype)


def _binom_plain(k, n, eta):
    k, n = k.astype(eta.dtype), n.astype(eta.dtype)
    return (jsp.gammaln(n + 1) - jsp.gammaln(k + 1) - jsp.gammaln(n - k + 1)
            + k * eta - n * jax.nn.softplus(eta))


CASES = [
    Case("student_t", fusedlp.student_t_lpdf, _student_plain, _student_make,
         (0, 1, 2, 3), (((6,), (), (), ()), ((3, 4), (4,), (3, 1), ()), ((), (5,), (), (5,)))),
    Case("gamma", fusedlp.gamma_lpdf, _gamma_plain, _gamma_make,
         (0, 1, 2), (((6,), (), ()), ((3, 4), (4,), (3, 1)), ((), (5,), (5,)))),
    Case("negative_binomial", fusedlp.negative_binomial_lpmf, _nb_plain, _nb_make,
         (1, 2), (((6,), (), ()), ((3, 4), (4,), (3, 1)), ((), (5,), ()))),
    Case("bernoulli_logit", fusedlp.bernoulli_logit_lpmf, _bern_plain, _bern_make,
         (1,), (((6,), ()), ((3, 4), (4,)), ((), (5,)))),
    Case("binomial_logit", fusedlp.binomial_logit_lpmf, _binom_plain, _binom_make,
         (2,), (((6,), (6,), ()), ((3, 4), (4,), (4,)), ((5,), (), (5,)))),
]
CASE = {c.name: c for c in CASES}


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_jit_vmap_hessian_and_no_retracing(case, rng, tol, empty_dispatch_cache):
    t = tol(np.float64)
    shapes = case.shapes[0]
    batch = [case.make(rng, shapes, np.float64) for _ in range(2)]
    stacked = tuple(np.stack(col) for col in zip(*batch))
    values = jax.vmap(case.fused)(*stacked)
    grads = jax.vmap(jax.grad(case.fused, argnums=case.diff))(*stacked)
    for b, args in enumerate(batch):
        v, g = jax.jit(jax.value_and_grad(case.fused, argnums=case.diff))(*args)
        assert_close(values[b], v, t["value"], abs(v))
        for gb, gi in zip(grads, g):
            assert_close(gb[b], gi, t["grad"], np.abs(gi))
    args = batch[0]
    h = jax.jit(fusedlp.hessian(case.fused, argnums=case.diff))(*args)
    want = jax.hessian(lambda *a: jnp.sum(case.plain_terms(*a)), argnums=case.diff)(
        *(as64(a) for a in args))
    hl, wl = jax.tree_util.tree_leaves(h), jax.tree_util.tree_leaves(want)
    scale = max(float(np.max(np.abs(w), initial=0.0)) for w in wl)
    for a, w in zip(hl, wl):
        np.testing.assert_allclose(a, w, rtol=t["grad"], atol=t["grad"] * scale)
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def vg(*a):
        return jax.value_and_grad(case.fused, argnums=case.diff)(*a)

    for a in (batch[0], batch[1], batch[0]):
        vg(*a)
    assert vg._cache_size() == 1


# ================================================================================ edges


def _vg(f, args, argnums):
    plain = f(*args)
    v, g = jax.value_and_grad(f, argnums=argnums)(*args)
    jv, _ = jax.jit(jax.value_and_grad(f, argnums=argnums))(*args)
    np.testing.assert_array_equal(np.isnan(jv), np.isnan(v))
    return plain, v, tuple(np.asarray(x) for x in g)


INVALID = [
    ("student_t", (0.3, 0.0, 0.0, 1.0)), ("student_t", (0.3, -1.0, 0.0, 1.0)),
    ("student_t", (0.3, INF, 0.0, 1.0)), ("student_t", (0.3, 3.0, INF, 1.0)),
    ("student_t", (0.3, 3.0, NAN, 1.0)), ("student_t", (0.3, 3.0, 0.0, 0.0)),
    ("student_t", (0.3, 3.0, 0.0, -2.0)), ("student_t", (0.3, 3.0, 0.0, INF)),
    ("student_t", (NAN, 3.0, 0.0, 1.0)),
    ("gamma", (1.0, 0.0, 1.0)), ("gamma", (1.0, -1.0, 1.0)), ("gamma", (1.0, INF, 1.0)),
    ("gamma", (1.0, 2.0, 0.0)), ("gamma", (1.0, 2.0, -1.0)), ("gamma", (1.0, 2.0, INF)),
    ("gamma", (1.0, NAN, 1.0)), ("gamma", (NAN, 2.0, 1.0)), ("gamma", (0.0, 2.0, -1.0)),
    ("negative_binomial", (2, -1.0, 1.0)), ("negative_binomial", (2, INF, 1.0)),
    ("negative_binomial", (2, 1.0, 0.0)), ("negative_binomial", (2, 1.0, -1.0)),
    ("negative_binomial", (2, 1.0, INF)), ("negative_binomial", (2, NAN, 1.0)),
    ("negative_binomial", (NAN, 1.0, 1.0)), ("negative_binomial", (0, -1.0, 1.0)),
    ("bernoulli_logit", (1, INF)), ("bernoulli_logit", (0, -INF)),
    ("bernoulli_logit", (1, NAN)), ("bernoulli_logit", (NAN, 0.0)),
    ("binomial_logit", (1, 3, INF)), ("binomial_logit", (1, 3, NAN)),
    ("binomial_logit", (1, -1, 0.0)), ("binomial_logit", (1, 2.5, 0.0)),
    ("binomial_logit", (1, INF, 0.0)), ("binomial_logit", (NAN, 3, 0.0)),
]


GOOD = {"student_t": (0.3, 3.0, 0.2, 1.5), "gamma": (1.0, 2.5, 1.5),
        "negative_binomial": (2, 1.5, 2.0), "bernoulli_logit": (1, 0.5),
        "binomial_logit": (1, 3, 0.5)}


def _stack(name, bads):
    """Arrays whose element 0 is good and elements 1.. are the bad combinations."""
    rows = [GOOD[name], *bads]
    return tuple(np.array(col, dtype=float) for col in zip(*rows))


@pytest.mark.parametrize("name", list(CASE))
def test_invalid_parameters_give_nan(name):
    """Each bad element's partials are NaN, the good element keeps its exact partials."""
    case = CASE[name]
    bads = [b for n, b in INVALID if n == name]
    args = _stack(name, bads)
    plain, v, grads = _vg(case.fused, args, case.diff)
    assert np.isnan(plain) and np.isnan(v)
    ref = jax.grad(case.fused, argnums=case.diff)(*(a[:1] for a in args))
    for g, r in zip(grads, ref):
        assert np.all(np.isnan(g[1:])), g
        np.testing.assert_allclose(g[0], np.asarray(r)[0], rtol=1e-12)
    for bad in bads:  # and the value alone, one bad element at a time
        assert np.isnan(case.fused(*(np.float64(b) for b in bad))), bad


OFF_SUPPORT = [
    ("student_t", (INF, 3.0, 0.0, 1.0)), ("student_t", (-INF, 3.0, 0.0, 1.0)),
    ("gamma", (-1.0, 2.0, 1.0)), ("gamma", (INF, 2.0, 1.0)), ("gamma", (0.0, 2.0, 1.0)),
    ("gamma", (-1e-300, 0.5, 1.0)),
    ("negative_binomial", (-1, 2.0, 1.0)), ("negative_binomial", (1.5, 2.0, 1.0)),
    ("negative_binomial", (INF, 2.0, 1.0)), ("negative_binomial", (3, 0.0, 1.0)),
    ("bernoulli_logit", (2, 0.5)), ("bernoulli_logit", (-1, 0.5)),
    ("bernoulli_logit", (0.5, 0.5)),
    ("binomial_logit", (4, 3, 0.5)), ("binomial_logit", (-1, 3, 0.5)),
    ("binomial_logit", (1.5, 3, 0.5)),
]


@pytest.mark.parametrize("name", list(CASE))
def test_out_of_support_is_minus_inf_with_zero_gradient(name, tol):
    case = CASE[name]
    offs = [o for n, o in OFF_SUPPORT if n == name]
    args = _stack(name, offs)
    plain, v, grads = _vg(case.fused, args, case.diff)
    assert plain == -INF and v == -INF
    ref = jax.grad(case.fused, argnums=case.diff)(*(a[:1] for a in args))
    for g, r in zip(grads, ref):
        np.testing.assert_array_equal(g[1:], 0.0)
        np.testing.assert_allclose(g[0], np.asarray(r)[0], rtol=1e-12)
    for off in offs:
        assert case.fused(*(np.float64(o) for o in off)) == -INF, off
    # a shared (scalar) parameter: the off-support elements add nothing to its sum
    last = case.diff[-1]
    shared = tuple(np.float64(a[0]) if i == last else a for i, a in enumerate(args))
    got = jax.grad(case.fused, argnums=last)(*shared)
    want = jax.grad(case.fused, argnums=last)(*(a[:1] if np.ndim(a) else a for a in shared))
    np.testing.assert_allclose(got, want, rtol=tol(np.float64)["grad"])


def test_boundaries_match_scipy():
    # gamma at x = 0: +inf, log(rate), -inf for shape < 1, = 1, > 1
    for a in (0.5, 1.0, 3.0):
        assert fusedlp.gamma_lpdf(0.0, a, 2.0) == ss.gamma.logpdf(0.0, a, scale=0.5)
    _, (dx, dr) = jax.value_and_grad(fusedlp.gamma_lpdf, argnums=(0, 2))(0.0, 1.0, 2.0)
    assert dr == 0.5 and dx == -2.0
    # shape < 1 at x = 0 (+inf): the partials of the finite part, log x read as 0, whole in
    # a sum (a tie in the support's minimum once sent each side half of them)
    x = np.array([0.0, 0.7])
    ds, dr = jax.grad(fusedlp.gamma_lpdf, argnums=(1, 2))(x, 0.5, 3.0)
    np.testing.assert_allclose(dr, 2 * 0.5 / 3.0 - 0.7, rtol=1e-14)
    want_ds = 2 * (math.log(3.0) - sps.digamma(0.5)) + math.log(0.7)
    np.testing.assert_allclose(ds, want_ds, rtol=1e-14)
    # negative binomial at mean 0: k = 0 exactly 0 with d/dmean = -1
    v, d = jax.value_and_grad(fusedlp.negative_binomial_lpmf, argnums=1)(0, 0.0, 3.0)
    assert v == 0.0 and d == -1.0
    # k > 0 at mean 0: -inf with zero partials (fuse's edge rule; docs/kernels.md, Edges)
    v, d = jax.value_and_grad(fusedlp.negative_binomial_lpmf, argnums=(1, 2))(3, 0.0, 3.0)
    assert v == -INF and d == (0.0, 0.0)
    # binomial with n = 0: k = 0 has probability 1
    v, d = jax.value_and_grad(fusedlp.binomial_logit_lpmf, argnums=2)(0, 0, 1.3)
    assert v == 0.0 and d == 0.0


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_logit_kernels_stable_for_large_logits(dtype, tol):
    t = tol(dtype)
    eta = np.array([-800.0, -40.0, -5.0, 0.0, 5.0, 40.0, 800.0], dtype)
    e64 = eta.astype(np.float64)
    for y in (0, 1):
        ys = np.full(7, y)
        v, g = jax.value_and_grad(fusedlp.bernoulli_logit_lpmf, argnums=1)(ys, eta)
        want = sps.log_expit(e64) if y == 1 else sps.log_expit(-e64)
        terms = np.array([fusedlp.bernoulli_logit_lpmf(y, e) for e in eta])
        np.testing.assert_allclose(terms, want, rtol=t["value"])  # -4.2e-18, not 0
        assert np.all(np.isfinite(g))
        want_g = sps.expit(-e64) if y == 1 else -sps.expit(e64)  # y - sigmoid, no cancellation
        np.testing.assert_allclose(g, want_g, rtol=t["grad"], atol=1e-30)
    k, n = np.array([0, 3, 10, 10, 0, 5, 10]), np.full(7, 10)
    v, g = jax.value_and_grad(fusedlp.binomial_logit_lpmf, argnums=2)(k, n, eta)
    want = (k * sps.log_expit(e64) + (n - k) * sps.log_expit(-e64)
            + sps.gammaln(n + 1.0) - sps.gammaln(k + 1.0) - sps.gammaln(n - k + 1.0))
    mag = np.sum(np.abs(k * sps.log_expit(e64)) + np.abs((n - k) * sps.log_expit(-e64)))
    np.testing.assert_allclose(v, want.sum(), rtol=t["value"], atol=t["value"] * mag)
    np.testing.assert_allclose(g, k - n * sps.expit(e64), rtol=t["grad"], atol=t["grad"])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [1, 5000])  # the exact pass alone; the fast pass first
def test_logit_kernels_finite_up_to_the_largest_logit(dtype, n):
    """At |logit| above half the largest float the log-mass is -|logit| or -0, finite: the
    sum |eta| + eta overflowed to -inf (or, in the binomial's Loader form, NaN) there. The
    gradient is y - sigmoid(eta), exactly 0 or +-1."""
    big = np.finfo(dtype).max
    for eta in (big, np.nextafter(big / 2, big), big / 4):
        for y in (0, 1):
            for sign in (1.0, -1.0):
                e = dtype(sign * eta)
                lost = dtype(-eta) if (y == 1) != (sign > 0) else dtype(-0.0)
                want_g = 0.0 if lost == 0 else float(np.sign(y - 0.5))
                ys, es = np.full(n, y, dtype), np.full(n, e, dtype)
                v, g = jax.value_and_grad(fusedlp.bernoulli_logit_lpmf, argnums=1)(ys, es)
                assert float(v) == n * float(lost) or (n > 1 and lost != 0 and v == -np.inf)
                np.testing.assert_array_equal(np.asarray(g), want_g)
                v, g = jax.value_and_grad(fusedlp.binomial_logit_lpmf, argnums=2)(
                    ys, np.ones(n, dtype), es)
                assert float(v) == n * float(lost) or (n > 1 and lost != 0 and v == -np.inf)
                np.testing.assert_array_equal(np.asarray(g), want_g)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_logit_kernels_curvature_at_zero(dtype):
    """At eta = 0 the gradient is y - 1/2 and the second derivative -1/4 per trial: the
    softplus pieces' derivatives meet abs's jvp (sign(0) = 1) exactly there."""
    zero = dtype(0.0)
    for y in (0, 1):
        f = functools.partial(fusedlp.bernoulli_logit_lpmf, dtype(y))
        assert jax.grad(f)(zero) == y - 0.5
        assert fusedlp.hessian(f)(zero) == -0.25
    for k in (0, 1, 3):
        g = functools.partial(fusedlp.binomial_logit_lpmf, dtype(k), dtype(3))
        assert jax.grad(g)(zero) == k - 1.5
        assert fusedlp.hessian(g)(zero) == -0.75


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_normalized_false_drops_constants_only(dtype, rng, tol):
    t = tol(dtype)
    k = np.array([[0, 1, 5], [20, 150, 1000]], np.int32)
    mean, phi = np.asarray([0.5, 3.0, 200.0], dtype), dtype(2.5)
    logk = sps.gammaln(k + 1.0)
    full = fusedlp.negative_binomial_lpmf(k, mean, phi)
    prop = fusedlp.negative_binomial_lpmf(k, mean, phi, normalized=False)
    ref = ss.nbinom.logpmf(k, float(phi), float(phi) / (mean.astype(np.float64) + float(phi)))
    mag = np.abs(ref).sum() + logk.sum()
    np.testing.assert_allclose(prop, ref.sum() + logk.sum(), rtol=t["value"],
                               atol=t["value"] * mag)
    np.testing.assert_allclose(full, ref.sum(), rtol=t["value"], atol=t["value"] * mag)
    g1 = jax.grad(fusedlp.negative_binomial_lpmf, argnums=(1, 2))(k, mean, phi)
    g2 = jax.grad(lambda *a: fusedlp.negative_binomial_lpmf(*a, normalized=False),
                  argnums=(1, 2))(k, mean, phi)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)
    kk, n, eta = np.array([0, 3, 7]), np.array([5, 10, 7]), np.asarray([0.1, -2.0, 1.0], dtype)
    lc = (sps.gammaln(n + 1.0) - sps.gammaln(kk + 1.0) - sps.gammaln(n - kk + 1.0)).sum()
    d = (fusedlp.binomial_logit_lpmf(kk, n, eta)
         - fusedlp.binomial_logit_lpmf(kk, n, eta, normalized=False))
    np.testing.assert_allclose(d, lc, rtol=t["value"] * 10, atol=t["value"] * 30)
    g1 = jax.grad(fusedlp.binomial_logit_lpmf, argnums=2)(kk, n, eta)
    g2 = jax.grad(lambda *a: fusedlp.binomial_logit_lpmf(*a, normalized=False), argnums=2)(
        kk, n, eta)
    # the normalized interior (0 < k < n) is Loader's form, a different sum: equal to rounding
    np.testing.assert_allclose(g1, g2, rtol=t["grad"], atol=t["grad"])


def test_empty_inputs_and_data_cotangents():
    for case in CASES:
        args = case.make(np.random.default_rng(0), tuple((0,) for _ in case.shapes[0]),
                         np.float64)
        v, g = jax.value_and_grad(case.fused, argnums=case.diff)(*args)
        assert v == 0.0 and case.fused(*args) == 0.0
        for i, gi in zip(case.diff, g):
            assert gi.shape == (0,) and gi.dtype == args[i].dtype
    # counts as floats: zero cotangent; as integers: float0
    dk = jax.grad(fusedlp.negative_binomial_lpmf, argnums=0)(np.array([0.0, 3.0]), 2.0, 1.5)
    np.testing.assert_array_equal(dk, np.zeros(2))
    dy = jax.grad(fusedlp.bernoulli_logit_lpmf, argnums=0)(np.array([0.0, 1.0]), 0.3)
    np.testing.assert_array_equal(dy, np.zeros(2))
    _, vjp = jax.vjp(fusedlp.binomial_logit_lpmf, np.array([1, 2]), np.array([3, 3]), 0.2)
    ck, cn, _ = vjp(jnp.ones(()))
    assert ck.dtype == cn.dtype == jax.dtypes.float0
    # float32 stays float32 with integer data and python-number defaults
    assert fusedlp.student_t_lpdf(np.float32([0.5]), 3.0).dtype == np.float32
    assert fusedlp.binomial_logit_lpmf(np.array([1]), 3, np.float32(0.2)).dtype == np.float32


VALIDATION = [
    (lambda v: fusedlp.student_t_lpdf(0.0, np.array([1.0, -1.0]), **v), "`df`", "df[1]"),
    (lambda v: fusedlp.student_t_lpdf(np.array([0.0, INF]), 2.0, **v), "`x`", "x[1]"),
    (lambda v: fusedlp.student_t_lpdf(0.0, 2.0, 0.0, np.array([1.0, 0.0]), **v), "`scale`",
     "scale[1]"),
    (lambda v: fusedlp.gamma_lpdf(np.array([1.0, -1.0]), 2.0, 1.0, **v), "`x`", "x[1]"),
    (lambda v: fusedlp.gamma_lpdf(1.0, np.array([2.0, 0.0]), 1.0, **v), "`shape`", "shape[1]"),
    (lambda v: fusedlp.gamma_lpdf(1.0, 2.0, np.array([1.0, -1.0]), **v), "`rate`", "rate[1]"),
    (lambda v: fusedlp.negative_binomial_lpmf(np.array([1, -1]), 2.0, 1.0, **v), "`k`", "k[1]"),
    (lambda v: fusedlp.negative_binomial_lpmf(1, np.array([1.0, INF]), 1.0, **v), "`mean`",
     "mean[1]"),
    (lambda v: fusedlp.negative_binomial_lpmf(1, 1.0, np.array([1.0, 0.0]), **v),
     "`concentration`", "concentration[1]"),
    (lambda v: fusedlp.bernoulli_logit_lpmf(np.array([0, 1, 2]), 0.0, **v), "`y`", "y[2]"),
    (lambda v: fusedlp.bernoulli_logit_lpmf(1, np.array([0.0, NAN]), **v), "`logit`",
     "logit[1]"),
    (lambda v: fusedlp.binomial_logit_lpmf(np.array([1, 4]), 3, 0.0, **v), "`k`", "k[1]"),
    (lambda v: fusedlp.binomial_logit_lpmf(1, np.array([3, -3]), 0.0, **v), "`n`", "n[1]"),
]


@pytest.mark.parametrize("call, name, where", VALIDATION, ids=[w for *_, w in VALIDATION])
def test_validation_names_argument_and_index(call, name, where):
    with pytest.raises(ValueError) as info:
        call({"validate_args": True})
    assert name in str(info.value) and where in str(info.value)
    value = call({})
    assert np.isnan(value) or value == -INF
    with fusedlp.validation(), pytest.raises(ValueError, match=name):
        call({})


def test_trace_time_errors_name_the_argument():
    with pytest.raises(ValueError, match="student_t_lpdf: argument `scale`"):
        fusedlp.student_t_lpdf(np.zeros(3), 2.0, 0.0, np.ones(4))
    with pytest.raises(ValueError, match="`rate`"):
        jax.jit(fusedlp.gamma_lpdf)(np.ones(3), 2.0, np.ones(2))
    with pytest.raises(ValueError, match="`concentration`"):
        fusedlp.negative_binomial_lpmf(np.ones(3, int), 1.0, np.ones(2))
    with pytest.raises(TypeError, match="`logit`"):
        fusedlp.bernoulli_logit_lpmf(1, np.array([1j]))
    with pytest.raises(TypeError, match="`n`"):
        fusedlp.binomial_logit_lpmf(1, "abc", 0.0)


def _counts_of(f, argnums, args):
    return sum(grad_primitive_counts(f, argnums, args).values())


def test_undifferentiated_arguments_cost_nothing():
    x = np.ones((3, 4))
    cases = [(fusedlp.student_t_lpdf, (x, 3.0, np.zeros(4), 1.5), (0, 1, 2, 3),
              [(0,), (1,), (2,), (3,), (1, 3)]),
             (fusedlp.gamma_lpdf, (x, 2.0, np.ones(4)), (0, 1, 2), [(0,), (1,), (2,)]),
             (fusedlp.negative_binomial_lpmf, (np.ones((3, 4), int), np.ones(4), 2.0), (1, 2),
              [(1,), (2,)])]
    for f, args, every, subsets in cases:
        total = _counts_of(f, every, args)
        for s in subsets:
            assert _counts_of(f, s, args) < total, (f.__name__, s)
    # float counts differentiated: no partial is formed for data
    k = np.ones(4)
    assert (_counts_of(fusedlp.negative_binomial_lpmf, (0,), (k, 1.0, 2.0))
            < _counts_of(fusedlp.negative_binomial_lpmf, (1,), (k, 1.0, 2.0)))


def test_docstring_examples_hold():
    assert round(float(fusedlp.student_t_lpdf(0.0, 1.0)), 6) == round(-math.log(math.pi), 6)
    assert round(float(fusedlp.gamma_lpdf(0.0, 1.0, 2.0)), 6) == round(math.log(2.0), 6)
    assert round(float(fusedlp.negative_binomial_lpmf(0, 2.0, 2.0)), 6) == round(
        2 * math.log(0.5), 6)


# ============================================================ found in review


@pytest.mark.parametrize("x", [1e20, -3e30, 1e38])
def test_student_t_float32_far_tail_is_finite(x):
    """In float32, z^2 overflows from |z| ~ 1.8e19; a finite x must still get its finite
    log-density (scipy's, computed in float64), not -inf, the out-of-support verdict."""
    f32 = np.float32
    got = fusedlp.student_t_lpdf(f32(x), f32(1.5), f32(0.5), f32(2.0))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ss.t.logpdf(x, 1.5, 0.5, 2.0), rtol=1e-6)
    grads = jax.grad(fusedlp.student_t_lpdf, argnums=(0, 1, 2, 3))(
        f32(x), f32(1.5), f32(0.5), f32(2.0))
    want = jax.grad(fusedlp.student_t_lpdf, argnums=(0, 1, 2, 3))(x, 1.5, 0.5, 2.0)
    for g, w in zip(grads, want):  # d/dx ~ 1/x: subnormal in float32 at 1e38, flushed to 0
        assert np.isfinite(g)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("z", [0.0, 1.0, -1.0, 1.0 + 2**-20, 3.0])
def test_student_t_float32_gradient_at_the_branch_point(z):
    """The float32 far-tail form switches at |z| / sqrt(nu) = 1: the gradient is exact on
    both sides and at the switch (jax's jvp of max/min would halve it there)."""
    f32 = np.float32
    grads = jax.grad(fusedlp.student_t_lpdf, argnums=(0, 1, 3))(f32(z), f32(1.0), 0.0, f32(1.0))
    want = jax.grad(fusedlp.student_t_lpdf, argnums=(0, 1, 3))(z, 1.0, 0.0, 1.0)
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("k, n, where", [
    (4, np.array([5, 3]), "first offending entry k = 4 (against n[1] = 3)"),
    (np.array([1, 4]), 3, "first offending entry k[1] = 4 (against n = 3)"),
    (np.array([[1], [4]]), np.array([5, 3]), "first offending entry k[1, 0] = 4 (against n[1] = 3)"),
])
def test_binomial_validation_names_the_arguments_own_entries(k, n, where):
    with pytest.raises(ValueError) as info:
        fusedlp.binomial_logit_lpmf(k, n, 0.0, validate_args=True)
    assert where in str(info.value)
