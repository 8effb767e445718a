"""Public surface: imports, trace-time errors, validation, hessian, symbolic zeros, EAM."""

from __future__ import annotations

import functools
import math

import jax
import jax.extend.core
import jax.numpy as jnp
import jax.scipy.special as jsp_special
import jax.scipy.stats as jsp_stats
import numpy as np
import pytest
from _helpers import count_primitives

import fusedlp
from fusedlp.eam import SEED_DENSITY, SEED_EMBEDDING

NAN, INF = float("nan"), float("inf")


def eam4(r, amp=SEED_DENSITY[0], beta=SEED_DENSITY[1], coeffs=SEED_EMBEDDING, mask=None,
         **kw):
    return fusedlp.eam_energy(r, density=(amp, beta), embedding=coeffs, mask=mask, **kw)


def assert_trees_close(got, want, rtol):
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def
    scale = max(float(np.max(np.abs(w), initial=0.0)) for w in want_leaves)
    for g, w in zip(got_leaves, want_leaves):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale)


# ======================================================================= import surface

KERNEL_API = {
    "eam_energy",
    "enable_validation",
    "hessian",
    "normal_lpdf",
    "poisson_log_lpmf",
    "poisson_lpmf",
    "validation",
}
# fusedlp.fit, fusedlp.summary and fusedlp.pointwise: tested in test_fit.py / test_summary.py
FIT_API = {"FitResult", "FitStatus", "FitSummary", "fit", "pointwise", "standard_errors",
           "summary"}
SHARDING_API = {"shard"}  # fusedlp.sharding, tested in test_sharding.py
# fusedlp.fuse and the kernels built with it, tested in test_fuse.py / test_more_kernels.py
FUSE_API = {"fuse", "student_t_lpdf", "gamma_lpdf", "negative_binomial_lpmf",
            "bernoulli_logit_lpmf", "binomial_logit_lpmf"}
EXPECTED_ALL = KERNEL_API | FIT_API | SHARDING_API | FUSE_API


def test_public_names():
    assert set(fusedlp.__all__) == EXPECTED_ALL
    assert len(fusedlp.__all__) == len(EXPECTED_ALL)
    for name in EXPECTED_ALL:
        assert callable(getattr(fusedlp, name))
    assert isinstance(fusedlp.__version__, str)


@pytest.mark.parametrize("name", sorted(EXPECTED_ALL))
def test_each_name_importable(name):
    namespace = {}
    exec(f"from fusedlp import {name}", namespace)
    assert namespace[name] is getattr(fusedlp, name)


def test_seed_constants():
    assert fusedlp.eam.SEED_DENSITY == (math.exp(-3.0), 3.0)
    assert fusedlp.eam.SEED_EMBEDDING == (0.0, 1.0, 1.0, 0.25)


# ================================================================== trace-time errors

R5 = np.linspace(0.1, 1.0, 5)

SHAPE_ERRORS = [
    ("normal x/loc", lambda: fusedlp.normal_lpdf(np.zeros(3), np.zeros(4)), "`loc`"),
    ("normal scale", lambda: fusedlp.normal_lpdf(np.zeros(3), 0.0, np.ones(4)), "`scale`"),
    ("normal 2d", lambda: fusedlp.normal_lpdf(np.zeros((2, 3)), np.zeros((3, 2))), "`loc`"),
    ("normal scale 2d",
     lambda: fusedlp.normal_lpdf(np.zeros((2, 3)), np.zeros(3), np.ones((3, 1))), "`scale`"),
    ("poisson", lambda: fusedlp.poisson_lpmf(np.zeros(3, int), np.ones(4)), "`rate`"),
    ("poisson_log", lambda: fusedlp.poisson_log_lpmf(np.zeros(3, int), np.ones(2)),
     "`log_rate`"),
]


@pytest.mark.parametrize("call, name", [p[1:] for p in SHAPE_ERRORS],
                         ids=[p[0] for p in SHAPE_ERRORS])
def test_non_broadcasting_shapes_raise_value_error_naming_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_shape_errors_are_raised_at_trace_time_under_jit():
    with pytest.raises(ValueError, match="`scale`"):
        jax.jit(fusedlp.normal_lpdf)(np.zeros(3), 0.0, np.ones(4))
    with pytest.raises(ValueError, match="`rate`"):
        jax.jit(jax.grad(fusedlp.poisson_lpmf, argnums=1))(np.zeros(3, int), np.ones(4))
    with pytest.raises(ValueError, match="`mask`"):
        jax.jit(lambda r, m: eam4(r, mask=m))(R5, np.ones(4, bool))


BAD_DTYPES = {
    "string": "abc",
    "complex": np.array([1.0 + 1.0j, 2.0]),
    "bool": np.array([True, False]),
}

DTYPE_ERRORS = [
    ("normal", "x", lambda v: fusedlp.normal_lpdf(v, 0.0, 1.0)),
    ("normal", "loc", lambda v: fusedlp.normal_lpdf(np.zeros(2), v, 1.0)),
    ("normal", "scale", lambda v: fusedlp.normal_lpdf(np.zeros(2), 0.0, v)),
    ("poisson", "k", lambda v: fusedlp.poisson_lpmf(v, 1.0)),
    ("poisson", "rate", lambda v: fusedlp.poisson_lpmf(np.zeros(2, int), v)),
    ("poisson_log", "k", lambda v: fusedlp.poisson_log_lpmf(v, 0.0)),
    ("poisson_log", "log_rate", lambda v: fusedlp.poisson_log_lpmf(np.zeros(2, int), v)),
    ("eam", "r", lambda v: eam4(v)),
    ("eam", "embedding", lambda v: eam4(R5, coeffs=v)),
]


@pytest.mark.parametrize("kind", list(BAD_DTYPES))
@pytest.mark.parametrize("call, name", [p[2:0:-1] for p in DTYPE_ERRORS],
                         ids=[f"{p[0]}-{p[1]}" for p in DTYPE_ERRORS])
def test_non_real_dtypes_raise_type_error_naming_argument(call, name, kind):
    with pytest.raises(TypeError, match=f"`{name}`"):
        call(BAD_DTYPES[kind])


@pytest.mark.parametrize("name", ["poisson_lpmf", "poisson_log_lpmf", "negative_binomial_lpmf",
                                  "binomial_logit_lpmf"])
def test_data_given_as_a_tuple_of_traced_arrays(name):
    """Counts as a tuple of traced arrays (one array when converted) are traced data: no
    data-only sum is formed from them at trace time. 2 x 1,500 elements: above the size
    from which the kernels form such sums for concrete data."""
    rng = np.random.default_rng(0)
    k = rng.poisson(3.0, (2, 1500)).astype(np.float64)
    p = jnp.asarray(rng.uniform(0.5, 2.0, (2, 1500)))
    extra = {"negative_binomial_lpmf": (2.0,)}.get(name, ())
    n = (np.full((2, 1500), 20.0),) if name == "binomial_logit_lpmf" else ()
    kernel = getattr(fusedlp, name)

    def tupled(a, b, p):
        return kernel((a, b), *n, p, *extra)

    got = jax.jit(jax.value_and_grad(tupled, argnums=2))(k[0], k[1], p)
    want = jax.value_and_grad(lambda p: kernel(k, *n, p, *extra))(p)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12)


@pytest.mark.parametrize("as_y", [lambda y: y, list, lambda y: jnp.asarray(y)],
                         ids=["numpy", "list", "jax"])
def test_bernoulli_takes_boolean_outcomes_as_zero_and_one(as_y):
    y = np.array([True, False, True, True])
    eta = jnp.array([0.3, -1.0, 2.0, -0.5])
    want = jax.value_and_grad(fusedlp.bernoulli_logit_lpmf, argnums=1)(y.astype(np.int32), eta)
    kernel = functools.partial(fusedlp.bernoulli_logit_lpmf, validate_args=True)
    for got in (jax.value_and_grad(kernel, argnums=1)(as_y(y), eta),
                jax.jit(jax.value_and_grad(fusedlp.bernoulli_logit_lpmf, argnums=1))(
                    jnp.asarray(y), eta)):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12)
    np.testing.assert_allclose(fusedlp.pointwise(fusedlp.bernoulli_logit_lpmf, y, eta),
                               fusedlp.pointwise(fusedlp.bernoulli_logit_lpmf, y * 1, eta))
    # a boolean logit, or boolean counts elsewhere, are still errors naming the argument
    with pytest.raises(TypeError, match="`logit`"):
        fusedlp.bernoulli_logit_lpmf(y, y)
    with pytest.raises(TypeError, match="`k`"):
        fusedlp.binomial_logit_lpmf(y, 1, 0.0)


@pytest.mark.parametrize("kind", list(BAD_DTYPES))
@pytest.mark.parametrize("which", [0, 1])
def test_eam_density_dtype_errors(kind, which):
    value = BAD_DTYPES[kind]
    value = value if isinstance(value, str) else value[0]  # a scalar of the bad dtype
    density = [0.05, 3.0]
    density[which] = value
    with pytest.raises(TypeError, match=["`density[0] (A)`", "`density[1] (beta)`"][which]
                       .replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        fusedlp.eam_energy(R5, density=tuple(density))


@pytest.mark.parametrize(
    "kwargs, exc, name",
    [
        (dict(mask=np.ones(4, bool)), ValueError, "`mask`"),
        (dict(mask=np.ones((1, 5), bool)), ValueError, "`mask`"),
        (dict(mask=np.ones(5, np.int32)), TypeError, "`mask`"),
        (dict(mask=np.ones(5, np.float64)), TypeError, "`mask`"),
        (dict(mask=["yes"] * 5), TypeError, "`mask`"),
        (dict(embedding=np.ones((2, 2))), ValueError, "`embedding`"),
        (dict(embedding=1.0), ValueError, "`embedding`"),
        (dict(embedding=np.ones(0)), ValueError, "`embedding`"),
        (dict(density=(np.ones(2), 3.0)), ValueError, "`density[0] (A)`"),
        (dict(density=(0.05, np.ones((1,)))), ValueError, "`density[1] (beta)`"),
        (dict(density=1.0), TypeError, "`density`"),
        (dict(density=(0.05,)), TypeError, "`density`"),
        (dict(density=(0.05, 3.0, 1.0)), TypeError, "`density`"),
    ],
    ids=["mask-shape", "mask-ndim", "mask-int", "mask-float", "mask-str", "embedding-2d",
         "embedding-scalar", "embedding-empty", "A-vector", "beta-vector", "density-scalar",
         "density-1", "density-3"],
)
def test_eam_argument_errors(kwargs, exc, name):
    with pytest.raises(exc, match=name.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        fusedlp.eam_energy(R5, **kwargs)


def test_eam_scalar_r_raises():
    with pytest.raises(ValueError, match="`r`"):
        fusedlp.eam_energy(1.0)


# ========================================================================== validation

SCALE_BAD = np.array([1.0, 2.0, 0.5, -1.0, 3.0, -2.0])  # first offender: index 3

VALIDATION_CASES = [
    ("normal x", lambda v: fusedlp.normal_lpdf(np.array([0.0, 1.0, INF]), **v), "`x`", "x[2]"),
    ("normal loc", lambda v: fusedlp.normal_lpdf(0.0, np.array([0.0, NAN, INF]), **v), "`loc`",
     "loc[1]"),
    ("normal scale", lambda v: fusedlp.normal_lpdf(np.zeros(6), 0.0, SCALE_BAD, **v),
     "`scale`", "scale[3]"),
    ("normal scale 2d",
     lambda v: fusedlp.normal_lpdf(0.0, 0.0, np.array([[1.0, 1.0], [1.0, 0.0]]), **v),
     "`scale`", "scale[1, 1]"),
    ("normal scale scalar", lambda v: fusedlp.normal_lpdf(0.0, 0.0, -1.0, **v), "`scale`",
     "scale"),
    ("poisson k", lambda v: fusedlp.poisson_lpmf(np.array([0.0, 1.0, -1.0, 0.5]), 1.0, **v),
     "`k`", "k[2]"),
    ("poisson k frac", lambda v: fusedlp.poisson_lpmf(np.array([0.0, 1.5]), 1.0, **v), "`k`",
     "k[1]"),
    ("poisson rate", lambda v: fusedlp.poisson_lpmf(1, np.array([1.0, 0.0, -0.1, INF]), **v),
     "`rate`", "rate[2]"),
    ("poisson rate inf", lambda v: fusedlp.poisson_lpmf(1, np.array([1.0, INF]), **v),
     "`rate`", "rate[1]"),
    ("poisson_log k", lambda v: fusedlp.poisson_log_lpmf(np.array([2, -3]), 0.0, **v), "`k`",
     "k[1]"),
    ("poisson_log log_rate",
     lambda v: fusedlp.poisson_log_lpmf(1, np.array([0.0, -INF, INF, NAN]), **v),
     "`log_rate`", "log_rate[2]"),
    ("eam r", lambda v: eam4(np.array([[0.1, 0.2], [NAN, 0.3]]), **v), "`r`", "r[1, 0]"),
    ("eam A", lambda v: eam4(R5, amp=0.0, **v), "`density[0] (A)`", "density[0] (A)"),
    ("eam beta", lambda v: eam4(R5, beta=-1.0, **v), "`density[1] (beta)`", "density[1] (beta)"),
    ("eam coeffs", lambda v: eam4(R5, coeffs=np.array([0.0, 1.0, INF]), **v), "`embedding`",
     "embedding[2]"),
]
validation_cases = pytest.mark.parametrize(
    "call, name, where", [c[1:] for c in VALIDATION_CASES], ids=[c[0] for c in VALIDATION_CASES]
)


@validation_cases
def test_validate_args_names_argument_and_first_offending_index(call, name, where):
    with pytest.raises(ValueError) as info:
        call(dict(validate_args=True))
    message = str(info.value)
    assert name in message
    assert where in message
    # without validation the value carries the verdict instead of raising
    value = call(dict())
    assert np.isnan(value) or value == -INF


@validation_cases
def test_global_validation_switch(call, name, where):
    fusedlp.enable_validation(True)
    with pytest.raises(ValueError, match=name.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        call(dict())
    call(dict(validate_args=False))  # the per-call flag wins over the global switch
    fusedlp.enable_validation(False)
    call(dict())


def test_validation_context_manager_restores_previous_state():
    bad = lambda: fusedlp.normal_lpdf(0.0, 0.0, -1.0)  # noqa: E731
    assert np.isnan(bad())
    with fusedlp.validation():
        with pytest.raises(ValueError, match="`scale`"):
            bad()
        with fusedlp.validation(False):
            assert np.isnan(bad())
        with pytest.raises(ValueError, match="`scale`"):
            bad()
    assert np.isnan(bad())
    with pytest.raises(RuntimeError), fusedlp.validation(True):
        raise RuntimeError  # an exception inside the block still restores the state
    assert np.isnan(bad())


def test_validation_passes_valid_inputs_unchanged(rng):
    x, loc, scale = rng.normal(size=5), rng.normal(size=5), rng.uniform(0.5, 2, 5)
    k, rate = rng.integers(0, 10, 5), rng.uniform(0.1, 5, 5)
    r = rng.uniform(0.1, 2, (3, 4))
    mask = np.array([[True] * 4, [True, False, False, False], [False] * 4])
    r_padded = np.where(mask, r, NAN)  # masked NaN is padding, not an error
    with fusedlp.validation():
        assert fusedlp.normal_lpdf(x, loc, scale) == fusedlp.normal_lpdf(
            x, loc, scale, validate_args=False)
        assert fusedlp.poisson_lpmf(k, rate) == fusedlp.poisson_lpmf(k, rate,
                                                                     validate_args=False)
        assert fusedlp.poisson_log_lpmf(k, np.log(rate)) == fusedlp.poisson_log_lpmf(
            k, np.log(rate), validate_args=False)
        # rate 0 and log-rate -inf are valid boundaries
        assert fusedlp.poisson_lpmf(0, 0.0) == 0.0
        assert fusedlp.poisson_log_lpmf(0, -INF) == 0.0
        assert eam4(r_padded, mask=mask) == eam4(r, mask=mask, validate_args=False)


def test_traced_inputs_are_never_validated():
    bad_scale = np.array([1.0, -1.0])
    f = lambda s: fusedlp.normal_lpdf(np.zeros(2), 0.0, s, validate_args=True)  # noqa: E731
    assert np.isnan(jax.jit(f)(bad_scale))
    grad = jax.grad(f)(bad_scale)
    assert np.isnan(grad[1]) and grad[0] == -1.0  # (z^2 - 1) / sigma with z = 0
    assert np.all(np.isnan(jax.vmap(f)(np.stack([bad_scale, bad_scale]))))
    with fusedlp.validation():
        assert np.isnan(jax.jit(fusedlp.poisson_lpmf)(np.array([1, 2]), np.array([1.0, -1.0])))
        assert np.isnan(jax.jit(lambda a: eam4(R5, amp=a))(-1.0))
        assert jax.jit(fusedlp.poisson_lpmf)(np.array([-1, 2]), 1.0) == -INF


# ============================================================================= dtypes


def test_mixed_dtype_cotangents_come_back_in_each_inputs_dtype(tol):
    x = np.array([0.5, -1.0, 2.0], np.float32)
    loc = np.array([0.1, 0.2, 0.3], np.float64)
    scale = np.float32(1.5)
    value, (dx, dloc, dscale) = jax.value_and_grad(fusedlp.normal_lpdf, argnums=(0, 1, 2))(
        x, loc, scale
    )
    assert value.dtype == np.float64
    assert dx.dtype == np.float32 and dloc.dtype == np.float64 and dscale.dtype == np.float32
    assert dx.shape == (3,) and dloc.shape == (3,) and dscale.shape == ()
    z = (x.astype(np.float64) - loc) / np.float64(scale)
    np.testing.assert_allclose(dloc, z / np.float64(scale), rtol=tol(np.float64)["grad"])


def test_python_number_defaults_keep_float32():
    x32 = np.array([0.5, -1.0, 2.0], np.float32)
    assert fusedlp.normal_lpdf(x32).dtype == np.float32
    assert fusedlp.normal_lpdf(x32, 0.5, 2.0).dtype == np.float32
    assert fusedlp.poisson_lpmf(3, np.float32(2.0)).dtype == np.float32
    r32 = np.array([[0.5, 1.0], [0.2, 0.7]], np.float32)
    value, dr = jax.value_and_grad(fusedlp.eam_energy)(r32)
    assert value.dtype == np.float32 and dr.dtype == np.float32
    assert eam4(r32, 0.05, 3.0, [0.0, 1.0, 0.5]).dtype == np.float32


def test_integer_data_take_the_default_float():
    assert fusedlp.normal_lpdf(np.arange(3)).dtype == np.float64
    assert fusedlp.normal_lpdf(np.arange(3), np.float32(0.0), np.float32(1.0)).dtype == (
        np.float32)
    assert fusedlp.poisson_lpmf(np.arange(3), 2).dtype == np.float64
    assert eam4(np.array([1, 2, 3])).dtype == np.float64


# ============================================================================== hessian


def _normal_plain(x, loc, scale):
    return jnp.sum(jsp_stats.norm.logpdf(x, loc, scale))


@pytest.mark.parametrize("loc_shape, scale_shape", [((), ()), ((5,), ()), ((5,), (5,)),
                                                    ((), (1,))])
def test_hessian_normal_loc_scale(rng, tol, loc_shape, scale_shape):
    x = rng.normal(size=5)
    loc = rng.normal(size=loc_shape)
    scale = rng.uniform(0.5, 2.0, size=scale_shape)
    got = jax.jit(fusedlp.hessian(fusedlp.normal_lpdf, argnums=(1, 2)))(x, loc, scale)
    want = jax.jit(jax.hessian(_normal_plain, argnums=(1, 2)))(x, loc, scale)
    assert_trees_close(got, want, tol(np.float64)["grad"])


@pytest.mark.parametrize("loc_kind", ["scalar", "array"])
@pytest.mark.parametrize("edge", [False, True], ids=["finite-x", "an-infinite-x"])
def test_hessian_normal_scalar_scale_above_small_size(rng, tol, loc_kind, edge):
    """Above fusedlp._xla.SMALL_NORMAL a scalar scale's sums take a lax.cond; their second
    derivatives come from normal._in_support_sums' own JVP. Against jax.hessian of the
    plain formula over the in-support elements, loc a scalar or u-linear array."""
    n = 20_000
    x, u = rng.normal(1.0, 2.0, size=n), rng.normal(size=n)
    if edge:
        x[n // 3] = -np.inf
    inside = np.isfinite(x)

    def ll(density, t):
        loc = t[0] if loc_kind == "scalar" else t[0] + t[1] * u
        return density(x, loc, t[2])

    def plain(x, loc, scale):
        safe = jnp.where(inside, x, 0.0)
        return jnp.sum(jnp.where(inside, jsp_stats.norm.logpdf(safe, loc, scale), 0.0))

    t = jnp.array([0.9, 0.3, 1.8])
    got = jax.jit(fusedlp.hessian(lambda t: ll(fusedlp.normal_lpdf, t)))(t)
    want = jax.jit(jax.hessian(lambda t: ll(plain, t)))(t)
    np.testing.assert_allclose(got, want, rtol=tol(np.float64)["grad"],
                               atol=1e-12 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("n", [50, 20_000])
def test_normal_in_support_sums_jvp_against_autodiff(rng, tol, n):
    """The closed-form JVP of the sums (Z2, Z1, count) behind a scalar scale, every tangent
    at once (x, an array loc, the scale), against forward mode of the plain masked sums."""
    from fusedlp import normal

    x, loc = rng.normal(1.0, 2.0, size=n), rng.normal(size=n)
    x[n // 4] = np.inf
    s = np.float64(1.7)
    inside = np.isfinite(x)

    def plain(x, loc, s):
        z = jnp.where(inside, (jnp.where(inside, x, 0.0) - loc) / s, 0.0)
        return jnp.sum(z * z), jnp.sum(z), jnp.asarray(inside.sum(), x.dtype)

    def fused(x, loc, s):
        z2 = jnp.sum(((x - loc) / s) ** 2)  # the value's sum: +inf here
        return normal._in_support_sums((n,), z2, x, loc, s)

    tangents = (rng.normal(size=n), rng.normal(size=n), np.float64(0.4))
    got = jax.jvp(fused, (x, loc, s), tangents)
    want = jax.jvp(plain, (x, loc, s), tangents)
    assert_trees_close(got, want, tol(np.float64)["grad"])


def test_hessian_normal_all_arguments_and_single_argnum(rng, tol):
    x, loc, scale = rng.normal(size=(2, 3)), rng.normal(size=3), np.float64(1.3)
    got = jax.jit(fusedlp.hessian(fusedlp.normal_lpdf, argnums=(0, 1, 2)))(x, loc, scale)
    want = jax.jit(jax.hessian(_normal_plain, argnums=(0, 1, 2)))(x, loc, scale)
    assert_trees_close(got, want, tol(np.float64)["grad"])
    got = fusedlp.hessian(fusedlp.normal_lpdf)(x, loc, scale)  # argnums=0 default, eager
    assert got.shape == (2, 3, 2, 3)
    np.testing.assert_allclose(got, want[0][0], rtol=tol(np.float64)["grad"])


def test_hessian_docstring_example():
    h = fusedlp.hessian(lambda mu: fusedlp.normal_lpdf(jnp.ones(4), mu, 2.0))(0.0)
    assert float(h) == -1.0


@pytest.mark.parametrize("form", ["rate", "log_rate"])
def test_hessian_poisson(rng, tol, form):
    k = np.array([0, 1, 4, 150])
    rate = rng.uniform(0.5, 5.0, 4)
    if form == "rate":
        got = jax.jit(fusedlp.hessian(fusedlp.poisson_lpmf, argnums=1))(k, rate)
        want = jax.jit(jax.hessian(lambda k, r: jnp.sum(jsp_stats.poisson.logpmf(k, r)),
                                   argnums=1))(k, rate)
        np.testing.assert_allclose(np.diag(got), -k / rate**2, rtol=tol(np.float64)["grad"])
    else:
        eta = np.log(rate)
        got = fusedlp.hessian(fusedlp.poisson_log_lpmf, argnums=1)(k, eta)
        want = jax.hessian(
            lambda k, e: jnp.sum(k * e - jnp.exp(e) - jsp_special.gammaln(k + 1.0)), argnums=1
        )(k, eta)
        np.testing.assert_allclose(np.diag(got), -rate, rtol=tol(np.float64)["grad"])
    assert got.shape == (4, 4)
    np.testing.assert_allclose(got, want, rtol=tol(np.float64)["grad"],
                               atol=tol(np.float64)["grad"])


def _eam_plain(r, amp, beta, coeffs):
    p = amp * jnp.sum(jnp.exp(-beta * r), axis=-1)
    ks = jnp.arange(1, coeffs.shape[0] + 1)
    return jnp.sum(coeffs * p[..., None] ** ks)


def test_hessian_eam(rng, tol):
    r = rng.uniform(-0.3, 2.0, (3, 4))
    amp, beta = np.float64(0.06), np.float64(2.5)
    coeffs = np.array([0.1, 1.0, 1.0, 0.25])
    t = tol(np.float64)["grad"]
    for argnums in [(1, 2), 3, (0, 1, 2, 3)]:
        got = jax.jit(fusedlp.hessian(eam4, argnums=argnums))(r, amp, beta, coeffs)
        want = jax.jit(jax.hessian(_eam_plain, argnums=argnums))(r, amp, beta, coeffs)
        assert_trees_close(got, want, t)
    # E is linear in the coefficients
    h_cc = fusedlp.hessian(eam4, argnums=3)(r, amp, beta, coeffs)
    np.testing.assert_array_equal(h_cc, np.zeros((4, 4)))


# ============================================================ symbolic zeros (jaxpr)


def _grad_cost(f, argnums, args):
    counts = count_primitives(jax.make_jaxpr(jax.grad(f, argnums=argnums))(*args).jaxpr)
    return counts["reduce_sum"], sum(counts.values()), counts


SYMBOLIC_CASES = [
    # every argument needs a reduction of its own partial: x (3,1), loc (1,4), scale ()
    ("normal", fusedlp.normal_lpdf, (np.ones((3, 1)), np.ones((1, 4)), np.float64(2.0)),
     (0, 1, 2), [(0,), (1,), (2,), (0, 1), (1, 2)]),
    ("poisson", fusedlp.poisson_lpmf, (np.ones((3, 4)), np.ones(4)), (0, 1), [(0,)]),
    ("poisson_log", fusedlp.poisson_log_lpmf, (np.ones((3, 4)), np.zeros(4)), (0, 1), [(0,)]),
    ("eam", eam4, (np.ones((3, 5)), np.float64(0.05), np.float64(3.0),
                   np.array(SEED_EMBEDDING)), (0, 1, 2, 3), [(0,), (1,), (2,), (3,), (1, 2)]),
]


@pytest.mark.parametrize("f, args, every, subsets", [c[1:] for c in SYMBOLIC_CASES],
                         ids=[c[0] for c in SYMBOLIC_CASES])
def test_undifferentiated_arguments_cost_nothing(f, args, every, subsets):
    """With symbolic zeros the forward rule skips partials nobody asked for.

    Differentiating a subset of the arguments must trace strictly fewer reductions (and
    fewer equations) than differentiating all of them; with symbolic zeros off the forward
    rule would compute every partial and the counts would be equal.
    """
    all_sums, all_eqns, _ = _grad_cost(f, every, args)
    for subset in subsets:
        sums, eqns, _ = _grad_cost(f, subset, args)
        assert sums < all_sums, (subset, sums, all_sums)
        assert eqns < all_eqns, (subset, eqns, all_eqns)


def test_poisson_rate_partial_not_formed_for_count_gradient():
    """d/dk only (float k): the k / rate division of d/drate must not be traced."""
    k, rate = np.ones((3, 4)), np.ones(4)
    _, _, only_k = _grad_cost(fusedlp.poisson_lpmf, 0, (k, rate))
    _, _, with_rate = _grad_cost(fusedlp.poisson_lpmf, (0, 1), (k, rate))
    assert only_k["div"] < with_rate["div"]


def test_eam_coefficient_powers_only_when_coefficients_are_differentiated():
    args = (np.ones((3, 5)), np.float64(0.05), np.float64(3.0), np.array(SEED_EMBEDDING))
    for argnums in [(0,), (1,), (2,), (0, 1, 2)]:
        assert _grad_cost(eam4, argnums, args)[2]["pow"] == 0, argnums
    assert _grad_cost(eam4, 3, args)[2]["pow"] >= 1


# =========================================================================== EAM model


def _seed_energy(r):
    """The seed study, verbatim: rho(r) = exp(-3 (r + 1)), F(p) = p^2 + p^3 + p^4 / 4."""
    r = np.asarray(r, np.float64)
    p = np.exp(-3.0 * (r + 1.0)).sum(axis=-1)
    return np.sum(p**2 + p**3 + p**4 / 4.0)


@pytest.mark.parametrize("shape", [(6,), (4, 6), (2, 3, 5)])
def test_eam_default_is_the_seed(rng, tol, shape):
    r = rng.uniform(-0.5, 2.0, shape)
    got = fusedlp.eam_energy(r)
    np.testing.assert_allclose(got, _seed_energy(r), rtol=tol(np.float64)["value"])
    explicit = fusedlp.eam_energy(r, density=SEED_DENSITY, embedding=SEED_EMBEDDING)
    assert got == explicit
    grad = jax.grad(fusedlp.eam_energy)(r)
    want = jax.grad(lambda r: jnp.sum(
        (lambda p: p**2 + p**3 + p**4 / 4)(jnp.exp(-3.0 * (r + 1.0)).sum(-1))))(r)
    np.testing.assert_allclose(grad, want, rtol=tol(np.float64)["grad"])


def test_eam_2d_equals_loop_over_sites(rng, tol):
    r = rng.uniform(-0.3, 2.0, (4, 5))
    amp, beta, coeffs = np.float64(0.07), np.float64(2.2), np.array([0.3, 1.0, 0.5, 0.2, 0.05])
    t = tol(np.float64)
    total = eam4(r, amp, beta, coeffs)
    loop = sum(float(eam4(r[s], amp, beta, coeffs)) for s in range(4))
    np.testing.assert_allclose(total, loop, rtol=t["value"])
    grads = jax.grad(eam4, argnums=(0, 1, 2, 3))(r, amp, beta, coeffs)
    site_grads = [jax.grad(eam4, argnums=(0, 1, 2, 3))(r[s], amp, beta, coeffs)
                  for s in range(4)]
    np.testing.assert_allclose(grads[0], np.stack([g[0] for g in site_grads]), rtol=t["grad"])
    for i in (1, 2, 3):
        np.testing.assert_allclose(grads[i], sum(np.asarray(g[i]) for g in site_grads),
                                   rtol=t["grad"])
    # a 3-D r is the same sites in another layout
    np.testing.assert_allclose(eam4(r.reshape(2, 2, 5), amp, beta, coeffs), total,
                               rtol=t["value"])


GARBAGE = np.array([NAN, INF, -INF, 1e300, -1e300, -1000.0])


def _ragged(rng):
    counts = [3, 1, 0, 5, 2]
    width = max(counts)
    sites = [rng.uniform(-0.3, 2.0, n) for n in counts]
    mask = np.array([[j < n for j in range(width)] for n in counts])
    padded = np.empty(mask.shape)
    padded[:] = np.resize(GARBAGE, mask.shape)  # garbage everywhere ...
    padded[mask] = np.concatenate(sites)  # ... except the real neighbours
    return sites, padded, mask


def test_eam_mask_ignores_padding(rng, tol):
    sites, padded, mask = _ragged(rng)
    amp, beta, coeffs = np.float64(0.06), np.float64(2.5), np.array([0.1, 1.0, 1.0, 0.25])
    t = tol(np.float64)
    argnums = (0, 1, 2, 3)
    value, grads = jax.value_and_grad(eam4, argnums=argnums)(padded, amp, beta, coeffs,
                                                              mask=mask)
    assert eam4(padded, amp, beta, coeffs, mask=mask) == value
    ragged_value = sum(float(eam4(s, amp, beta, coeffs)) for s in sites)
    np.testing.assert_allclose(value, ragged_value, rtol=t["value"])
    dr = np.asarray(grads[0])
    np.testing.assert_array_equal(dr[~mask], 0.0)  # exactly zero, not NaN
    ragged_grads = [jax.grad(eam4, argnums=argnums)(s, amp, beta, coeffs) for s in sites]
    np.testing.assert_allclose(dr[mask], np.concatenate([g[0] for g in ragged_grads]),
                               rtol=t["grad"])
    for i in (1, 2, 3):
        np.testing.assert_allclose(grads[i], sum(np.asarray(g[i]) for g in ragged_grads),
                                   rtol=t["grad"])
    # the same under jit and vmap (mask traced too)
    jitted = jax.jit(lambda r, m: eam4(r, amp, beta, coeffs, mask=m))(padded, mask)
    np.testing.assert_allclose(jitted, value, rtol=t["value"])
    batched = jax.vmap(lambda r, m: eam4(r, amp, beta, coeffs, mask=m))(
        np.stack([padded, padded[::-1]]), np.stack([mask, mask[::-1]]))
    np.testing.assert_allclose(batched, [value, value], rtol=t["value"])


def test_eam_all_true_mask_equals_no_mask(rng, tol):
    r = rng.uniform(0.0, 2.0, (3, 4))
    mask = np.ones_like(r, bool)
    np.testing.assert_allclose(eam4(r, mask=mask), eam4(r), rtol=tol(np.float64)["value"])
    np.testing.assert_allclose(jax.grad(lambda r: eam4(r, mask=mask))(r), jax.grad(eam4)(r),
                               rtol=tol(np.float64)["grad"])


def test_eam_all_false_mask_is_zero():
    r = np.resize(GARBAGE, (2, 3))
    mask = np.zeros((2, 3), bool)
    value, dr = jax.value_and_grad(lambda r: eam4(r, mask=mask))(r)
    assert value == 0.0
    np.testing.assert_array_equal(dr, np.zeros((2, 3)))


def test_eam_masked_entries_get_zero_gradient_even_when_their_site_overflows():
    """Padding receives exactly zero whatever happens at the real neighbours of its site."""
    r = np.array([[-1000.0, 0.5, NAN], [0.4, 0.9, 1e300]])
    mask = np.array([[True, True, False], [True, True, False]])
    value, dr = jax.value_and_grad(lambda r: eam4(r, mask=mask))(r)
    assert value == INF
    dr = np.asarray(dr)
    np.testing.assert_array_equal(dr[~mask], 0.0)
