"""The contract every kernel keeps, parametrized over kernel x dtype x broadcast shape.

Each kernel case supplies
  * ``fused``: the fusedlp call, ``fused(*args)``;
  * ``reference``: an independent float64 reference (scipy.stats, or a numpy formula for
    EAM) returning the value and the magnitude of its summed terms;
  * ``plain``: the same log-density written with plain ``jax.numpy`` / ``jax.scipy`` so that
    ordinary autodiff gives reference gradients;
  * ``grad_mag``: per argument, the sum of the magnitudes of the elementwise partials that
    the gradient sums (the conditioning of that sum), used to scale absolute tolerances;
  * ``make``: data for given argument shapes, a dtype and a profile ("wide" spans the
    documented ranges; "fd" keeps finite differences well conditioned).

The checks: value vs reference, gradient vs autodiff of the plain formula, finite
differences (check_grads, reverse mode, first and second order), jit, vmap, grad∘jit,
dtype and shape of value and cotangents, and no retracing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import chex
import jax
import jax.numpy as jnp
import jax.scipy.special as jsp_special
import jax.scipy.stats as jsp_stats
import numpy as np
import pytest
import scipy.special
import scipy.stats
from _helpers import assert_close
from jax.test_util import check_grads

import fusedlp

# ------------------------------------------------------------------------------ helpers


def sum_to_shape(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``a`` over the axes that broadcasting from ``shape`` added (numpy, for references)."""
    a = np.asarray(a)
    lead = a.ndim - len(shape)
    a = a.sum(axis=tuple(range(lead))) if lead else a
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and a.shape[i] != 1)
    return a.sum(axis=axes, keepdims=True).reshape(shape) if axes else a.reshape(shape)


def as64(a):
    """float64 copy of a floating argument (integers are left alone)."""
    a = np.asarray(a)
    return a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a


def broadcast_grad_mag(terms: Callable, diff: tuple[int, ...], args) -> list[np.ndarray]:
    """|elementwise partials| summed back to each argument's shape, via the plain formula."""
    args = [as64(a) for a in args]
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    full = [jnp.broadcast_to(a, shape) for a in args]
    grads = jax.grad(lambda *a: jnp.sum(terms(*a)), argnums=diff)(*full)
    return [sum_to_shape(np.abs(np.asarray(g)), np.shape(args[i])) for g, i in zip(grads, diff)]


# ------------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fused: Callable
    reference: Callable  # float64 numpy args -> (value, magnitude)
    plain: Callable  # jnp args -> scalar
    grad_mag: Callable  # float64 numpy args -> list of arrays, one per diff arg
    make: Callable  # (rng, shapes, dtype, profile) -> tuple of args
    diff: tuple[int, ...]  # floating arguments that are differentiated
    shapes: tuple  # argument shape combinations


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)

# --- normal


def _normal_make(rng, shapes, dtype, profile):
    xs, ls, ss = shapes
    loc = rng.normal(0.0, 1.0, ls)
    if profile == "wide":
        x = rng.normal(0.0, 3.0, xs)
        if x.size:
            x.flat[0] = 60.0  # a large |z|
        scale = 10.0 ** rng.uniform(-2.0, 2.0, ss)
    else:
        x = rng.normal(0.0, 2.0, xs)
        scale = rng.uniform(0.5, 2.0, ss)
    return tuple(np.asarray(a, dtype=dtype) for a in (x, loc, scale))


def _normal_reference(x, loc, scale):
    terms = scipy.stats.norm.logpdf(x, loc, scale)
    z = (x - loc) / scale
    mag = 0.5 * z * z + np.abs(np.log(scale)) + _HALF_LOG_2PI
    return np.sum(terms), np.sum(mag)


def _normal_terms(x, loc, scale):
    return jsp_stats.norm.logpdf(x, loc, scale)


NORMAL = Case(
    name="normal",
    fused=lambda x, loc, scale: fusedlp.normal_lpdf(x, loc, scale),
    reference=_normal_reference,
    plain=lambda x, loc, scale: jnp.sum(_normal_terms(x, loc, scale)),
    grad_mag=lambda *a: broadcast_grad_mag(_normal_terms, (0, 1, 2), a),
    make=_normal_make,
    diff=(0, 1, 2),
    shapes=(
        ((), (), ()),
        ((6,), (), ()),
        ((6,), (6,), (6,)),
        ((3, 4), (4,), ()),
        ((3, 1), (1, 4), (3, 4)),
        ((), (3, 4), (3, 1)),
        ((4,), (3, 1), (4,)),
    ),
)

# --- poisson (rate and log-rate)

_K_POOL = np.array([0, 1, 2, 3, 7, 20, 150, 1000])


def _counts(rng, shape):
    k = rng.choice(_K_POOL, size=shape)
    if k.size >= 3:
        k.flat[:3] = [0, 150, 1000]  # zero and counts beyond the exact log-factorial table
    return np.asarray(k, dtype=np.int32)


def _poisson_make(rng, shapes, dtype, profile):
    ks, rs = shapes
    if profile == "wide":
        rate = 10.0 ** rng.uniform(-3.0, 3.0, rs)
    else:
        rate = rng.uniform(0.5, 5.0, rs)
    return _counts(rng, ks), np.asarray(rate, dtype=dtype)


def _poisson_log_make(rng, shapes, dtype, profile):
    k, rate = _poisson_make(rng, shapes, np.float64, profile)
    return k, np.asarray(np.log(rate), dtype=dtype)


def _poisson_mag(k, rate):
    k = np.asarray(k, np.float64)
    return np.abs(scipy.special.xlogy(k, rate)) + rate + scipy.special.gammaln(k + 1)


def _poisson_reference(k, rate):
    return np.sum(scipy.stats.poisson.logpmf(k, rate)), np.sum(_poisson_mag(k, rate))


def _poisson_log_reference(k, eta):
    rate = np.exp(eta)
    return np.sum(scipy.stats.poisson.logpmf(k, rate)), np.sum(_poisson_mag(k, rate))


def _poisson_terms(k, rate):
    return jsp_stats.poisson.logpmf(k, rate)


def _poisson_log_terms(k, eta):
    k = jnp.asarray(k, eta.dtype)
    return k * eta - jnp.exp(eta) - jsp_special.gammaln(k + 1.0)


_POISSON_SHAPES = (
    ((), ()),
    ((6,), ()),
    ((), (6,)),
    ((3, 4), (4,)),
    ((3, 1), (1, 4)),
    ((3, 4), (3, 4)),
)

POISSON = Case(
    name="poisson",
    fused=lambda k, rate: fusedlp.poisson_lpmf(k, rate),
    reference=_poisson_reference,
    plain=lambda k, rate: jnp.sum(_poisson_terms(k, rate)),
    grad_mag=lambda *a: broadcast_grad_mag(_poisson_terms, (1,), a),
    make=_poisson_make,
    diff=(1,),
    shapes=_POISSON_SHAPES,
)

POISSON_LOG = Case(
    name="poisson_log",
    fused=lambda k, eta: fusedlp.poisson_log_lpmf(k, eta),
    reference=_poisson_log_reference,
    plain=lambda k, eta: jnp.sum(_poisson_log_terms(k, eta)),
    grad_mag=lambda *a: broadcast_grad_mag(_poisson_log_terms, (1,), a),
    make=_poisson_log_make,
    diff=(1,),
    shapes=_POISSON_SHAPES,
)

# --- EAM embedding energy


def _eam_make(rng, shapes, dtype, profile):
    (rs,) = shapes
    r = rng.uniform(-0.5, 2.5, rs)
    amp = rng.uniform(0.03, 0.08)
    beta = rng.uniform(2.0, 4.0)
    coeffs = np.array([0.1, 1.0, 1.0, 0.25]) + rng.uniform(0.0, 0.1, 4)
    return tuple(np.asarray(a, dtype=dtype) for a in (r, amp, beta, coeffs))


def _eam_parts(r, amp, beta, coeffs):
    e = np.exp(-beta * r)
    s = e.sum(-1)
    p = amp * s
    ks = np.arange(1, len(coeffs) + 1)
    powers = p[..., None] ** ks  # (sites..., K)
    dF = (ks * coeffs * p[..., None] ** (ks - 1)).sum(-1)
    return e, s, p, powers, dF


def _eam_reference(r, amp, beta, coeffs):
    _, _, _, powers, _ = _eam_parts(r, amp, beta, coeffs)
    terms = coeffs * powers
    return terms.sum(), np.abs(terms).sum()


def _eam_grad_mag(r, amp, beta, coeffs):
    e, s, p, powers, dF = _eam_parts(r, amp, beta, coeffs)
    adF = np.abs(dF)
    return [
        np.abs(amp * beta * adF[..., None] * e),
        np.sum(adF * s),
        amp * np.sum(adF * np.sum(np.abs(r) * e, axis=-1)),
        sum_to_shape(np.abs(powers), coeffs.shape),
    ]


def _eam_plain(r, amp, beta, coeffs):
    p = amp * jnp.sum(jnp.exp(-beta * r), axis=-1)
    return jnp.sum(jnp.polyval(jnp.concatenate([coeffs[::-1], jnp.zeros(1, coeffs.dtype)]), p))


EAM = Case(
    name="eam",
    fused=lambda r, amp, beta, coeffs: fusedlp.eam_energy(
        r, density=(amp, beta), embedding=coeffs
    ),
    reference=_eam_reference,
    plain=_eam_plain,
    grad_mag=_eam_grad_mag,
    make=_eam_make,
    diff=(0, 1, 2, 3),
    shapes=(((5,),), ((3, 5),), ((2, 3, 4),)),
)

# --- the fuse-built kernels: Student's t, gamma, negative binomial, Bernoulli and binomial
# with a logit. Their magnitudes are written out term by term (value) and piece by piece
# (each partial of the plain formula), so that cancellation between the pieces (the
# lgamma/digamma differences at large parameters, k - n sigmoid(eta)) sets the absolute
# tolerance, as the normal case's 0.5 z^2 + |log scale| + ... does. Two broadcast patterns
# each (their compilations dominate the module's time): between them a scalar parameter
# (a partial summed over the data), a vector one, and a broadcast in both directions.


def elementwise_mag(parts: Callable, args) -> list[np.ndarray]:
    """``parts`` (float64 numpy args broadcast to one shape -> one elementwise magnitude array
    per differentiated argument) summed back to each argument's shape."""
    args = [as64(a) for a in args]
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    full = [np.broadcast_to(a, shape) for a in args]
    # parts lists the differentiated arguments in order; their shapes come from args
    return [sum_to_shape(np.broadcast_to(m, shape), np.shape(args[i]))
            for i, m in parts(*full)]


def _student_t_make(rng, shapes, dtype, profile):
    xs, ds, ls, ss = shapes
    if profile == "wide":
        loc = rng.normal(0.0, 3.0, ls)
        x = rng.standard_t(3.0, xs) * 5.0
        if x.size:
            x.flat[0] = 1e3  # far in the tail
        df = 10.0 ** rng.uniform(-1.0, 3.0, ds)
        scale = 10.0 ** rng.uniform(-2.0, 2.0, ss)
    else:
        loc = rng.normal(0.0, 1.0, ls)
        x = rng.normal(0.0, 2.0, xs)
        df = rng.uniform(2.0, 10.0, ds)
        scale = rng.uniform(0.5, 2.0, ss)
    return tuple(np.asarray(a, dtype=dtype) for a in (x, df, loc, scale))


def _student_t_pieces(x, df, loc, scale):
    z = (x - loc) / scale
    h = 0.5 * (df + 1.0)
    lq = np.log1p(z * z / df)
    return z, h, lq


def _student_t_reference(x, df, loc, scale):
    terms = scipy.stats.t.logpdf(x, df, loc, scale)
    _, h, lq = _student_t_pieces(x, df, loc, scale)
    mag = (np.abs(scipy.special.gammaln(h)) + np.abs(scipy.special.gammaln(0.5 * df))
           + 0.5 * np.abs(np.log(df * np.pi)) + np.abs(np.log(scale)) + h * lq)
    return np.sum(terms), np.sum(np.broadcast_to(mag, terms.shape))


def _student_t_mag_parts(x, df, loc, scale):
    z, h, lq = _student_t_pieces(x, df, loc, scale)
    dz = (df + 1.0) * np.abs(z) / (scale * (df + z * z))  # |d/dx| = |d/dloc|
    ddf = (0.5 * (np.abs(scipy.special.digamma(h)) + np.abs(scipy.special.digamma(0.5 * df))
                  + 1.0 / df + lq) + h * z * z / (df * (df + z * z)))
    dscale = ((df + 1.0) * z * z / (df + z * z) + 1.0) / scale
    return [(0, dz), (1, ddf), (2, dz), (3, dscale)]


def _student_t_terms(x, df, loc, scale):
    return jsp_stats.t.logpdf(x, df, loc, scale)


STUDENT_T = Case(
    name="student_t",
    fused=lambda x, df, loc, scale: fusedlp.student_t_lpdf(x, df, loc, scale),
    reference=_student_t_reference,
    plain=lambda *a: jnp.sum(_student_t_terms(*a)),
    grad_mag=lambda *a: elementwise_mag(_student_t_mag_parts, a),
    make=_student_t_make,
    diff=(0, 1, 2, 3),
    shapes=(
        ((3, 4), (4,), (3, 1), ()),
        ((), (5,), (), (5,)),
    ),
)


def _gamma_make(rng, shapes, dtype, profile):
    xs, as_, rs = shapes
    if profile == "wide":
        x = 10.0 ** rng.uniform(-3.0, 3.0, xs)
        shape = 10.0 ** rng.uniform(-1.0, 3.0, as_)  # both sides of the Loader form at 2
        rate = 10.0 ** rng.uniform(-2.0, 2.0, rs)
    else:
        x = rng.uniform(0.5, 3.0, xs)
        shape = rng.uniform(1.5, 5.0, as_)
        rate = rng.uniform(0.5, 2.0, rs)
    return tuple(np.asarray(a, dtype=dtype) for a in (x, shape, rate))


def _gamma_reference(x, shape, rate):
    terms = scipy.stats.gamma.logpdf(x, shape, scale=1.0 / rate)
    lx, lr = np.abs(np.log(x)), np.abs(np.log(rate))
    mag = (lr + np.abs(shape - 1.0) * (lr + lx) + np.abs(scipy.special.gammaln(shape))
           + rate * x)
    return np.sum(terms), np.sum(np.broadcast_to(mag, terms.shape))


def _gamma_mag_parts(x, shape, rate):
    return [(0, np.abs(shape - 1.0) / x + rate),
            (1, np.abs(np.log(rate)) + np.abs(scipy.special.digamma(shape))
             + np.abs(np.log(x))),
            (2, shape / rate + x)]


def _gamma_terms(x, shape, rate):
    return jsp_stats.gamma.logpdf(x, shape, scale=1.0 / rate)


GAMMA = Case(
    name="gamma",
    fused=lambda x, shape, rate: fusedlp.gamma_lpdf(x, shape, rate),
    reference=_gamma_reference,
    plain=lambda *a: jnp.sum(_gamma_terms(*a)),
    grad_mag=lambda *a: elementwise_mag(_gamma_mag_parts, a),
    make=_gamma_make,
    diff=(0, 1, 2),
    shapes=(
        ((6,), (), ()),
        ((3, 4), (4,), (3, 1)),
    ),
)


def _nb_make(rng, shapes, dtype, profile):
    ks, ms, cs = shapes
    if profile == "wide":
        k = _counts(rng, ks)
        mean = 10.0 ** rng.uniform(-1.0, 3.0, ms)
        conc = 10.0 ** rng.uniform(-1.0, 2.0, cs)
    else:
        k = np.asarray(rng.integers(0, 15, ks), dtype=np.int32)
        mean = rng.uniform(1.0, 10.0, ms)
        conc = rng.uniform(1.0, 10.0, cs)
    return k, np.asarray(mean, dtype=dtype), np.asarray(conc, dtype=dtype)


def _nb_reference(k, mean, conc):
    terms = scipy.stats.nbinom.logpmf(k, conc, conc / (conc + mean))
    k = np.asarray(k, np.float64)
    s = mean + conc
    mag = (scipy.special.gammaln(k + conc) + np.abs(scipy.special.gammaln(conc))
           + scipy.special.gammaln(k + 1.0) + k * np.abs(np.log(mean / s))
           + conc * np.abs(np.log(conc / s))
           # scipy's own conditioning: it takes p = conc / (conc + mean), rounded, and forms
           # k log1p(-p), whose error is k eps p / (1 - p) = k eps conc / mean
           + k * conc / mean)
    return np.sum(terms), np.sum(np.broadcast_to(mag, terms.shape))


def _nb_mag_parts(k, mean, conc):
    k = np.asarray(k, np.float64)
    s = mean + conc
    return [(1, k / mean + (k + conc) / s),
            (2, np.abs(scipy.special.digamma(k + conc)) + np.abs(scipy.special.digamma(conc))
             + np.abs(np.log(conc / s)) + 1.0 + (k + conc) / s)]


def _nb_terms(k, mean, conc):
    # the mean/concentration form (jax.scipy.stats.nbinom's p = conc / (conc + mean) would
    # carry the rounding of 1 - p into d/dmean at conc >> mean)
    k = jnp.asarray(k, mean.dtype)
    s = mean + conc
    return (jsp_special.gammaln(k + conc) - jsp_special.gammaln(conc)
            - jsp_special.gammaln(k + 1.0) + jsp_special.xlogy(k, mean / s)
            + conc * jnp.log(conc / s))


NEGATIVE_BINOMIAL = Case(
    name="negative_binomial",
    fused=lambda k, mean, conc: fusedlp.negative_binomial_lpmf(k, mean, conc),
    reference=_nb_reference,
    plain=lambda *a: jnp.sum(_nb_terms(*a)),
    grad_mag=lambda *a: elementwise_mag(_nb_mag_parts, a),
    make=_nb_make,
    diff=(1, 2),
    shapes=(
        ((3, 4), (4,), (3, 1)),
        ((), (5,), ()),
    ),
)


def _logit_draw(rng, shape, profile):
    if profile == "fd":
        return rng.normal(0.0, 1.5, shape)
    eta = rng.normal(0.0, 4.0, shape)
    if eta.size >= 2:
        eta.flat[:2] = [-40.0, 40.0]  # p = 4e-18 and 1 - 4e-18
    return eta


def _bernoulli_make(rng, shapes, dtype, profile):
    ys, ls = shapes
    y = rng.integers(0, 2, ys)
    if y.size >= 2:
        y.flat[:2] = [0, 1]
    return np.asarray(y, dtype=np.int32), np.asarray(_logit_draw(rng, ls, profile), dtype)


def _bernoulli_reference(y, eta):
    # log p(y | eta) = log sigmoid(+-eta), passed to scipy as p = expit(+-eta) with the sign
    # that makes y = 1: scipy's log1p(-p) at p = expit(40) would be log(0) (p rounds to 1)
    t = np.where(y == 1, eta, -eta)
    terms = scipy.stats.bernoulli.logpmf(np.ones_like(t), scipy.special.expit(t))
    return np.sum(terms), np.sum(np.abs(terms))  # every term <= 0: no cancellation


def _bernoulli_terms(y, eta):
    return jax.nn.log_sigmoid(jnp.where(y == 1, eta, -eta))


BERNOULLI_LOGIT = Case(
    name="bernoulli_logit",
    fused=lambda y, eta: fusedlp.bernoulli_logit_lpmf(y, eta),
    reference=_bernoulli_reference,
    plain=lambda *a: jnp.sum(_bernoulli_terms(*a)),
    grad_mag=lambda *a: broadcast_grad_mag(_bernoulli_terms, (1,), a),
    make=_bernoulli_make,
    diff=(1,),
    shapes=(
        ((6,), ()),
        ((3, 4), (4,)),
    ),
)

# trials: fixed per shape (every draw for one shape has the same n, so that the vmap test's
# counts from one draw are in the support of another's trials); 0 (only k = 0) included
_N_POOL = np.array([20, 1, 1000, 5, 150, 0, 2, 40])


def _binomial_make(rng, shapes, dtype, profile):
    ks, ns, ls = shapes
    n = np.resize(_N_POOL if profile == "wide" else _N_POOL[[0, 3, 7, 6]], ns)
    # k <= the smallest n it is broadcast against
    full = np.broadcast_to(n, np.broadcast_shapes(ks, ns, ls))
    lead = full.ndim - len(ks)
    nmin = full.min(axis=tuple(range(lead))) if lead else full
    axes = tuple(i for i, m in enumerate(ks) if m == 1 and nmin.shape[i] != 1)
    nmin = (nmin.min(axis=axes, keepdims=True) if axes else nmin).reshape(ks)
    k = np.floor(rng.uniform(0.0, 1.0, ks) * (nmin + 1)).astype(np.int64)
    if k.size >= 2:
        k.flat[0], k.flat[1] = 0, nmin.flat[1]  # k = 0 and k = n
    return (np.asarray(k, np.int32), np.asarray(n, np.int32),
            np.asarray(_logit_draw(rng, ls, profile), dtype))


def _binomial_reference(k, n, eta):
    # binom(k | n, p) = binom(n - k | n, 1 - p): scipy gets p = expit(-|eta|) <= 1/2, whose
    # 1 - p keeps its digits (expit(40) rounds to 1)
    k, n, eta = np.broadcast_arrays(k, n, eta)
    kk = np.where(eta > 0, n - k, k)
    terms = scipy.stats.binom.logpmf(kk, n, scipy.special.expit(-np.abs(eta)))
    k = np.asarray(k, np.float64)
    n = np.asarray(n, np.float64)
    g = scipy.special.gammaln
    mag = (g(n + 1.0) + g(k + 1.0) + g(n - k + 1.0) - k * scipy.special.log_expit(eta)
           - (n - k) * scipy.special.log_expit(-eta))
    return np.sum(terms), np.sum(mag)


def _binomial_mag_parts(k, n, eta):
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    return [(2, k * scipy.special.expit(-eta) + (n - k) * scipy.special.expit(eta))]


def _binomial_terms(k, n, eta):
    k, n = jnp.asarray(k, eta.dtype), jnp.asarray(n, eta.dtype)
    return (jsp_special.gammaln(n + 1.0) - jsp_special.gammaln(k + 1.0)
            - jsp_special.gammaln(n - k + 1.0) + k * jax.nn.log_sigmoid(eta)
            + (n - k) * jax.nn.log_sigmoid(-eta))


BINOMIAL_LOGIT = Case(
    name="binomial_logit",
    fused=lambda k, n, eta: fusedlp.binomial_logit_lpmf(k, n, eta),
    reference=_binomial_reference,
    plain=lambda *a: jnp.sum(_binomial_terms(*a)),
    grad_mag=lambda *a: elementwise_mag(_binomial_mag_parts, a),
    make=_binomial_make,
    diff=(2,),
    shapes=(
        ((6,), (6,), ()),
        ((3, 4), (4,), (4,)),
    ),
)

CASES = (NORMAL, POISSON, POISSON_LOG, EAM, STUDENT_T, GAMMA, NEGATIVE_BINOMIAL,
         BERNOULLI_LOGIT, BINOMIAL_LOGIT)


def _shape_id(shapes):
    return "-".join("x".join(map(str, s)) or "s" for s in shapes)


PARAMS = [
    pytest.param(case, shapes, id=f"{case.name}[{_shape_id(shapes)}]")
    for case in CASES
    for shapes in case.shapes
]
case_shapes = pytest.mark.parametrize(("case", "shapes"), PARAMS)


def _diff_args(case, args):
    return tuple(args[i] for i in case.diff)


def _with(case, args, diff_values):
    """``args`` with the differentiated positions replaced by ``diff_values``."""
    out = list(args)
    for i, v in zip(case.diff, diff_values):
        out[i] = v
    return tuple(out)


# ------------------------------------------------------------------------------- tests


@case_shapes
def test_value_matches_reference(case, shapes, dtype, rng, tol):
    args = case.make(rng, shapes, dtype, "wide")
    got = case.fused(*args)
    ref, mag = case.reference(*(as64(a) for a in args))
    assert got.shape == ()
    assert got.dtype == dtype
    assert_close(got, ref, tol(dtype)["value"], mag, "value")


@case_shapes
def test_value_is_the_same_with_and_without_differentiation(case, shapes, dtype, rng, tol):
    args = case.make(rng, shapes, dtype, "wide")
    plain_value = case.fused(*args)
    vg_value, _ = jax.value_and_grad(case.fused, argnums=case.diff)(*args)
    _, mag = case.reference(*(as64(a) for a in args))
    assert_close(vg_value, plain_value, tol(dtype)["value"], mag, "value_and_grad value")


@case_shapes
def test_grad_matches_autodiff_of_plain_formula(case, shapes, dtype, rng, tol):
    args = case.make(rng, shapes, dtype, "wide")
    got = jax.grad(case.fused, argnums=case.diff)(*args)
    args64 = tuple(as64(a) for a in args)
    ref = jax.grad(case.plain, argnums=case.diff)(*args64)
    mags = case.grad_mag(*args64)
    for i, g, r, m in zip(case.diff, got, ref, mags):
        assert g.shape == np.shape(args[i]), (i, g.shape)
        assert g.dtype == dtype, (i, g.dtype)
        assert_close(g, r, tol(dtype)["grad"], m, f"d/darg{i}")
    # a cotangent other than 1 scales every partial (the backward rule is not just a copy)
    _, vjp = jax.vjp(lambda *d: case.fused(*_with(case, args, d)), *_diff_args(case, args))
    for g, r, m in zip(vjp(jnp.asarray(-2.5, dtype)), ref, mags):
        assert g.dtype == dtype
        assert_close(g, -2.5 * np.asarray(r), tol(dtype)["grad"], 2.5 * np.asarray(m), "vjp")


@case_shapes
@pytest.mark.parametrize("order", [1, 2])
def test_check_grads_finite_differences(case, shapes, dtype, order, rng, tol):
    t = tol(dtype)
    args = case.make(rng, shapes, dtype, "fd")
    # jitted: eager, every primitive of the rules is compiled on its own (minutes per case in
    # CI); test_jit_and_grad_compositions checks that jit changes nothing
    f = jax.jit(lambda *d: case.fused(*_with(case, args, d)))
    check_grads(f, _diff_args(case, args), order=order, modes=["rev"],
                eps=t["fd_eps"], atol=t["fd_atol"], rtol=t["fd_rtol"])


@case_shapes
def test_jit_and_grad_compositions(case, shapes, dtype, rng, tol):
    args = case.make(rng, shapes, dtype, "wide")
    t = tol(dtype)
    _, mag = case.reference(*(as64(a) for a in args))
    eager = case.fused(*args)
    jitted = jax.jit(case.fused)(*args)
    assert jitted.dtype == eager.dtype == dtype
    assert_close(jitted, eager, t["value"], mag, "jit value")

    grad = jax.grad(case.fused, argnums=case.diff)
    eager_g = grad(*args)
    outer = jax.jit(grad)(*args)
    inner = jax.grad(jax.jit(case.fused), argnums=case.diff)(*args)
    mags = case.grad_mag(*(as64(a) for a in args))
    for i, e, o, n, m in zip(case.diff, eager_g, outer, inner, mags):
        assert o.dtype == n.dtype == e.dtype == dtype
        assert o.shape == n.shape == e.shape == np.shape(args[i])
        assert_close(o, e, t["grad"], m, "jit(grad)")
        assert_close(n, e, t["grad"], m, "grad(jit)")


@case_shapes
def test_vmap_over_leading_batch_axis(case, shapes, dtype, rng, tol):
    t = tol(dtype)
    batch = [case.make(rng, shapes, dtype, "wide") for _ in range(2)]
    stacked = tuple(np.stack(col) for col in zip(*batch))
    # each program jitted (compiled once, not primitive by primitive: minutes per case in CI
    # eagerly); test_jit_and_grad_compositions checks that jit changes nothing
    one, grad = jax.jit(case.fused), jax.jit(jax.grad(case.fused, argnums=case.diff))
    values = jax.jit(jax.vmap(case.fused))(*stacked)
    grads = jax.jit(jax.vmap(grad))(*stacked)
    # reverse mode through vmap: a batched cotangent reaches the backward rule
    weights = jnp.asarray([1.5, -0.5], dtype)
    weighted = jax.jit(jax.grad(lambda *a: jnp.sum(weights * jax.vmap(case.fused)(*a)),
                                argnums=case.diff))(*stacked)
    # batch only the first argument; the others are shared (in_axes=None)
    in_axes = (0,) + (None,) * (len(stacked) - 1)
    firsts = jax.jit(jax.vmap(case.fused, in_axes=in_axes))(stacked[0], *batch[0][1:])
    assert values.shape == firsts.shape == (2,)
    assert values.dtype == firsts.dtype == dtype
    for b, args in enumerate(batch):
        _, mag = case.reference(*(as64(a) for a in args))
        assert_close(values[b], one(*args), t["value"], mag, f"vmap value {b}")
        for g, gw, w, m in zip(grads, weighted, grad(*args),
                               case.grad_mag(*(as64(a) for a in args))):
            assert g.shape[1:] == w.shape and gw.shape == g.shape and gw.dtype == dtype
            assert_close(g[b], w, t["grad"], m, f"vmap grad {b}")
            c = float(weights[b])
            assert_close(gw[b], c * np.asarray(w), t["grad"], abs(c) * m, f"grad of vmap {b}")
        mixed = (args[0],) + batch[0][1:]
        _, mag = case.reference(*(as64(a) for a in mixed))
        assert_close(firsts[b], one(*mixed), t["value"], mag, f"vmap first-arg {b}")


@case_shapes
def test_no_retracing(case, shapes, dtype, rng, empty_dispatch_cache):
    first = case.make(rng, shapes, dtype, "wide")
    second = case.make(rng, shapes, dtype, "wide")
    chex.clear_trace_counter()  # the counter is keyed by code location, shared across params

    @jax.jit
    @chex.assert_max_traces(n=1)
    def value(*a):
        return case.fused(*a)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def value_and_grad(*a):
        return jax.value_and_grad(case.fused, argnums=case.diff)(*a)

    for args in (first, second, first):
        value(*args)
        value_and_grad(*args)
    assert value._cache_size() == 1
    assert value_and_grad._cache_size() == 1
