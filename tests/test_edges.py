"""Edge conventions: the value carries the verdict, nothing raises, gradients are exact.

invalid parameters -> NaN; data outside the support -> -inf with a zero partial for that
element; boundaries (rate 0) exact; empty inputs -> 0.0; EAM overflow -> +inf; float32
without catastrophic cancellation and with an exact log k! for small k.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.stats as jsp_stats
import numpy as np
import pytest
import scipy.special
import scipy.stats
from _helpers import count_primitives

import fusedlp
from fusedlp import _xla
from fusedlp.eam import SEED_DENSITY, SEED_EMBEDDING

NAN, INF = float("nan"), float("inf")


def value_and_grads(f, args, argnums):
    """Value of the plain call, and value and gradients under value_and_grad.

    The same value and gradients must also come out of ``jax.jit``: XLA rewrites the
    compiled program (e.g. (a / s) / s into a / (s * s)), and an edge can break there only.
    """
    plain = f(*args)
    vg = jax.value_and_grad(f, argnums=argnums)
    vg_value, grads = vg(*args)
    grads = tuple(np.asarray(g) for g in grads)
    jit_value, jit_grads = jax.jit(vg)(*args)
    np.testing.assert_allclose(jit_value, vg_value, rtol=1e-5, err_msg="value under jit")
    for g, jg in zip(grads, jit_grads):
        np.testing.assert_allclose(jg, g, rtol=1e-5, err_msg="gradient under jit")
    return plain, vg_value, grads


def eam(r, amp=SEED_DENSITY[0], beta=SEED_DENSITY[1], coeffs=SEED_EMBEDDING, mask=None):
    return fusedlp.eam_energy(r, density=(amp, beta), embedding=coeffs, mask=mask)


# ================================================================================ normal

X3 = np.array([0.3, -1.2, 2.0])


@pytest.mark.parametrize(
    "loc, scale",
    [
        (0.0, 0.0),
        (0.0, -1.0),
        (0.0, INF),
        (0.0, -INF),
        (0.0, NAN),
        (INF, 1.0),
        (-INF, 1.0),
        (NAN, 1.0),
    ],
    ids=["scale0", "scale-neg", "scale+inf", "scale-inf", "scale-nan", "loc+inf", "loc-inf",
         "loc-nan"],
)
@pytest.mark.parametrize("scale_is_array", [False, True], ids=["scalar-scale", "array-scale"])
def test_normal_invalid_params_give_nan(loc, scale, scale_is_array):
    scale = np.full(3, scale) if scale_is_array else scale
    plain, vg, (dx, dloc, dscale) = value_and_grads(fusedlp.normal_lpdf, (X3, loc, scale),
                                                    (0, 1, 2))
    assert np.isnan(plain) and np.isnan(vg)
    assert np.all(np.isnan(dloc)) and np.all(np.isnan(dscale)) and np.all(np.isnan(dx))


@pytest.mark.parametrize("scale_is_array", [False, True], ids=["scalar-scale", "array-scale"])
def test_normal_one_invalid_loc_element(scale_is_array):
    """NaN value; the partials of the offending element are NaN, the others are exact."""
    loc = np.array([0.0, INF, 0.0])
    scale = np.ones(3) if scale_is_array else 1.0
    plain, vg, (dx, dloc) = value_and_grads(fusedlp.normal_lpdf, (X3, loc, scale), (0, 1))
    assert np.isnan(plain) and np.isnan(vg)
    assert np.isnan(dloc[1]) and np.isnan(dx[1])
    np.testing.assert_array_equal(dloc[[0, 2]], X3[[0, 2]])  # (x - 0) / 1**2
    np.testing.assert_array_equal(dx[[0, 2]], -X3[[0, 2]])


def test_normal_one_invalid_scale_element():
    loc = np.zeros(3)
    scale = np.array([1.0, 1.0, -2.0])
    plain, vg, (dloc, dscale) = value_and_grads(fusedlp.normal_lpdf, (X3, loc, scale), (1, 2))
    assert np.isnan(plain) and np.isnan(vg)
    assert np.isnan(dloc[2]) and np.isnan(dscale[2])
    np.testing.assert_array_equal(dloc[:2], X3[:2])
    np.testing.assert_array_equal(dscale[:2], X3[:2] ** 2 - 1.0)


@pytest.mark.parametrize("where", [0, 1, 2])
def test_normal_nan_data_gives_nan(where):
    x = X3.copy()
    x[where] = NAN
    plain, vg, (dloc,) = value_and_grads(fusedlp.normal_lpdf, (x, 0.0, 1.0), (1,))
    assert np.isnan(plain) and np.isnan(vg) and np.isnan(dloc)


@pytest.mark.parametrize("scale", [1.5, np.array([1.5, 1.5, 1.5])], ids=["scalar", "array"])
def test_normal_nan_wins_over_infinite_data(scale):
    """NaN anywhere -> NaN, even if another element is outside the support (-inf)."""
    x = np.array([NAN, INF, 0.5])
    plain, vg, _ = value_and_grads(fusedlp.normal_lpdf, (x, 0.0, scale), (1, 2))
    assert np.isnan(plain), plain
    assert np.isnan(vg), f"value_and_grad value is {vg}, the plain call gives {plain}"


@pytest.mark.parametrize("bad", [INF, -INF])
@pytest.mark.parametrize("scale_is_array", [False, True], ids=["scalar-scale", "array-scale"])
def test_normal_infinite_data_is_outside_support(bad, scale_is_array, tol):
    x = np.array([0.3, bad, -1.1])
    loc = np.array([0.1, 0.2, 0.3])
    scale = np.full(3, 2.0) if scale_is_array else 2.0
    plain, vg, (dx, dloc, dscale) = value_and_grads(fusedlp.normal_lpdf, (x, loc, scale),
                                                    (0, 1, 2))
    assert plain == -INF and vg == -INF
    # element 1 contributes nothing to any partial
    assert dx[1] == 0.0 and dloc[1] == 0.0
    keep = np.array([0, 2])
    ok_scale = scale[keep] if scale_is_array else scale
    ref_dx, ref_dloc, ref_dscale = jax.grad(fusedlp.normal_lpdf, argnums=(0, 1, 2))(
        x[keep], loc[keep], ok_scale
    )
    np.testing.assert_array_equal(dx[keep], ref_dx)
    np.testing.assert_array_equal(dloc[keep], ref_dloc)
    if scale_is_array:
        assert dscale[1] == 0.0, f"d/dscale of the out-of-support element is {dscale[1]}"
        np.testing.assert_allclose(dscale[keep], ref_dscale, rtol=tol(np.float64)["grad"])
    else:
        np.testing.assert_allclose(
            dscale, ref_dscale, rtol=tol(np.float64)["grad"],
            err_msg="the out-of-support element must not contribute to d/dscale",
        )


@pytest.mark.parametrize(
    "xs, ls, ss",
    [((0,), (), ()), ((0,), (0,), (0,)), ((0, 3), (3,), ()), ((2, 0), (2, 1), (1, 0)),
     ((0,), (1,), (1,))],
)
def test_normal_empty_inputs(xs, ls, ss):
    args = (np.zeros(xs), np.zeros(ls), np.ones(ss))
    plain, vg, grads = value_and_grads(fusedlp.normal_lpdf, args, (0, 1, 2))
    assert plain == 0.0 and vg == 0.0
    for a, g in zip(args, grads):
        assert g.shape == a.shape and g.dtype == a.dtype
        np.testing.assert_array_equal(g, np.zeros_like(a))


def test_normal_unnormalized_drops_the_constant(rng, tol):
    x = rng.normal(size=(3, 4))
    loc, scale = rng.normal(size=4), rng.uniform(0.5, 2.0, size=(3, 1))
    full = fusedlp.normal_lpdf(x, loc, scale)
    prop = fusedlp.normal_lpdf(x, loc, scale, normalized=False)
    np.testing.assert_allclose(full - prop, -12 * 0.5 * math.log(2 * math.pi),
                               rtol=tol(np.float64)["value"])
    g_full = jax.grad(fusedlp.normal_lpdf, argnums=(0, 1, 2))(x, loc, scale)
    g_prop = jax.grad(lambda *a: fusedlp.normal_lpdf(*a, normalized=False), argnums=(0, 1, 2))(
        x, loc, scale
    )
    for a, b in zip(g_full, g_prop):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("base", [1e4, -3e5, 1e6])
@pytest.mark.parametrize("scale_is_array", [False, True], ids=["scalar-scale", "array-scale"])
def test_normal_float32_large_loc_no_cancellation(base, scale_is_array, tol):
    t = tol(np.float32)
    ulp = abs(np.spacing(np.float32(base)))  # offsets that survive rounding to float32
    x = (np.float32(base) + np.array([1.0, -2.0, 4.0, 12.0], np.float32) * ulp).astype(np.float32)
    loc = np.float32(base)
    s = np.float32(4 * ulp)  # z = 0.25, -0.5, 1, 3: an expanded square would lose everything
    scale = np.full(4, s, np.float32) if scale_is_array else s
    x64, loc64, scale64 = (np.asarray(a, np.float64) for a in (x, loc, scale))
    z = (x64 - loc64) / scale64
    assert np.all(np.abs(z) > 1e-2) and np.all(z != 0)  # the data really probes the difference
    value, (dx, dloc, dscale) = jax.value_and_grad(fusedlp.normal_lpdf, argnums=(0, 1, 2))(
        x, loc, scale
    )
    assert value.dtype == dx.dtype == dloc.dtype == dscale.dtype == np.float32
    ref = scipy.stats.norm.logpdf(x64, loc64, scale64).sum()
    np.testing.assert_allclose(value, ref, rtol=t["value"])
    np.testing.assert_allclose(fusedlp.normal_lpdf(x, loc, scale), ref, rtol=t["value"])
    np.testing.assert_allclose(dx, -z / scale64, rtol=t["grad"])
    np.testing.assert_allclose(dloc, np.sum(z / scale64), rtol=t["grad"])
    ref_dscale = (z * z - 1) / scale64
    np.testing.assert_allclose(dscale, ref_dscale if scale_is_array else ref_dscale.sum(),
                               rtol=t["grad"])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_normal_large_z(dtype, tol):
    t = tol(dtype)
    x = np.array([1e3, -2e3, 5.0], dtype)
    loc, scale = dtype(1.0), dtype(1e-2)
    x64, loc64, scale64 = (np.asarray(a, np.float64) for a in (x, loc, scale))
    z = (x64 - loc64) / scale64
    value, (dloc, dscale) = jax.value_and_grad(fusedlp.normal_lpdf, argnums=(1, 2))(x, loc, scale)
    np.testing.assert_allclose(value, scipy.stats.norm.logpdf(x64, loc64, scale64).sum(),
                               rtol=t["value"])
    np.testing.assert_allclose(fusedlp.normal_lpdf(x, loc, scale), value, rtol=t["value"])
    np.testing.assert_allclose(dloc, np.sum(z / scale64), rtol=t["grad"])
    np.testing.assert_allclose(dscale, np.sum((z * z - 1) / scale64), rtol=t["grad"])


EXTREME_SCALES = [
    (np.float64, 1e-150), (np.float64, 1e150), (np.float64, 1e-200), (np.float64, 1e200),
    (np.float32, 1e-15), (np.float32, 1e15), (np.float32, 1e-20), (np.float32, 1e20),
]


@pytest.mark.parametrize("dtype, s", EXTREME_SCALES,
                         ids=[f"{np.dtype(d).name}-{s:g}" for d, s in EXTREME_SCALES])
@pytest.mark.parametrize("scale_is_array", [False, True], ids=["scalar-scale", "array-scale"])
def test_normal_extreme_but_valid_scale(dtype, s, scale_is_array, tol):
    """Any finite positive scale is valid; z is O(1) here, so nothing should overflow."""
    t = tol(dtype)
    x = (np.array([0.0, 1.0, -2.0]) * s).astype(dtype)
    scale = np.full(3, s, dtype) if scale_is_array else dtype(s)
    x64, scale64 = np.asarray(x, np.float64), np.asarray(scale, np.float64)
    z = x64 / scale64
    ref = scipy.stats.norm.logpdf(x64, 0.0, scale64).sum()
    plain, vg, (dx, dscale) = value_and_grads(fusedlp.normal_lpdf, (x, dtype(0.0), scale), (0, 2))
    np.testing.assert_allclose(plain, ref, rtol=t["value"], err_msg="plain value")
    np.testing.assert_allclose(vg, ref, rtol=t["value"], err_msg="value_and_grad value")
    np.testing.assert_allclose(dx, -z / scale64, rtol=t["grad"], err_msg="d/dx")
    ref_ds = (z * z - 1) / scale64
    np.testing.assert_allclose(dscale, ref_ds if scale_is_array else ref_ds.sum(),
                               rtol=t["grad"], err_msg="d/dscale")


# =============================================================================== poisson

POISSONS = {
    "rate": (fusedlp.poisson_lpmf, lambda rate: rate),
    "log_rate": (fusedlp.poisson_log_lpmf, lambda rate: np.log(rate)),
}
poisson_forms = pytest.mark.parametrize("form", list(POISSONS))


normalized_both = pytest.mark.parametrize("normalized", [True, False],
                                          ids=["normalized", "propto"])
kinds_both = pytest.mark.parametrize("kfloat", [False, True], ids=["int-k", "float-k"])


def _poisson(form, normalized):
    f, to_param = POISSONS[form]
    return (lambda k, p: f(k, p, normalized=normalized)), to_param


def _counts(values, kfloat):
    return np.asarray(values, np.float64 if kfloat else np.int64)


INVALID_PARAMS = [("rate", -1.0), ("rate", -1e-300), ("rate", INF), ("rate", NAN),
                  ("log_rate", INF), ("log_rate", NAN)]  # every log-rate < +inf is valid


@pytest.mark.parametrize("form, bad", INVALID_PARAMS,
                         ids=[f"{f}={b}" for f, b in INVALID_PARAMS])
@normalized_both
@kinds_both
def test_poisson_invalid_rate_gives_nan(form, bad, normalized, kfloat):
    f, _ = _poisson(form, normalized)
    good = {"rate": (2.0, 0.5), "log_rate": (0.7, -0.7)}[form]
    param = np.array([good[0], bad, good[1]])
    for counts in ([1, 3, 0], [1, 0, 2]):  # the bad element with k > 0 and with k = 0
        k = _counts(counts, kfloat)
        plain, vg, (d,) = value_and_grads(f, (k, param), (1,))
        assert np.isnan(plain) and np.isnan(vg)
        assert np.isnan(d[1])
        # the other partials are the plain ones
        ref = jax.grad(f, argnums=1)(k[[0, 2]], param[[0, 2]])
        np.testing.assert_array_equal(d[[0, 2]], ref)
        # a scalar invalid parameter poisons everything
        plain, vg, (d,) = value_and_grads(f, (k, param[1]), (1,))
        assert np.isnan(plain) and np.isnan(vg) and np.isnan(d)


@poisson_forms
@normalized_both
def test_poisson_nan_count_gives_nan(form, normalized):
    f, to_param = _poisson(form, normalized)
    k = np.array([1.0, NAN, 2.0])
    plain, vg, (d,) = value_and_grads(f, (k, to_param(np.array([1.0, 2.0, 3.0]))), (1,))
    assert np.isnan(plain) and np.isnan(vg) and np.isnan(d[1])


@poisson_forms
@normalized_both
@pytest.mark.parametrize("bad_k", [-1.0, -3.0, 1.5, 0.25, INF, -INF, -1, -3, -1000])
def test_poisson_count_outside_support(form, normalized, bad_k, tol):
    f, to_param = _poisson(form, normalized)
    kfloat = isinstance(bad_k, float)
    k = np.array([2, bad_k, 0], np.float64 if kfloat else np.int64)
    param = to_param(np.array([1.5, 2.5, 0.7]))
    argnums = (0, 1) if kfloat else (1,)
    plain, vg, grads = value_and_grads(f, (k, param), argnums)
    dparam = grads[-1]
    assert plain == -INF and vg == -INF
    assert dparam[1] == 0.0
    if kfloat:
        np.testing.assert_array_equal(grads[0], np.zeros(3))  # k is data
    ref = jax.grad(f, argnums=1)(k[[0, 2]], param[[0, 2]])
    np.testing.assert_array_equal(dparam[[0, 2]], ref)
    # with a shared (scalar) parameter the element contributes nothing to the sum either
    _, (dscalar,) = jax.value_and_grad(f, argnums=(1,))(k, param[1])
    np.testing.assert_allclose(dscalar, jax.grad(f, argnums=1)(k[[0, 2]], param[1]),
                               rtol=tol(np.float64)["grad"])


@normalized_both
@kinds_both
def test_poisson_rate_zero_boundary(normalized, kfloat):
    f, _ = _poisson("rate", normalized)
    zeros = _counts(np.zeros(4), kfloat)
    # k = 0: exactly 0 with d/drate = -1
    value, d = jax.value_and_grad(f, argnums=1)(zeros[0], 0.0)
    assert value == 0.0 and d == -1.0
    plain, value, (d,) = value_and_grads(f, (zeros, np.zeros(4)), (1,))
    assert plain == 0.0 and value == 0.0
    np.testing.assert_array_equal(d, -np.ones(4))
    plain, value, (d,) = value_and_grads(f, (zeros, 0.0), (1,))
    assert plain == 0.0 and value == 0.0 and d == -4.0
    # k > 0 at rate 0: impossible, -inf (derivative k / 0 - 1 = +inf, not NaN)
    for k in (1, 5, 1000):
        plain, vg, (d,) = value_and_grads(f, (_counts(k, kfloat), 0.0), (1,))
        assert plain == -INF and vg == -INF
        assert d == INF
    # mixed
    plain, value, (d,) = value_and_grads(f, (_counts([0, 2], kfloat), np.array([0.0, 0.0])),
                                         (1,))
    assert plain == -INF and value == -INF
    np.testing.assert_array_equal(d, [-1.0, INF])


@normalized_both
@kinds_both
def test_poisson_log_rate_minus_inf_boundary(normalized, kfloat):
    f, _ = _poisson("log_rate", normalized)
    plain, vg, (d,) = value_and_grads(f, (_counts(0, kfloat), -INF), (1,))
    assert plain == 0.0 and vg == 0.0
    assert d == 0.0  # k - exp(eta) = 0 - 0
    plain, vg, (d,) = value_and_grads(f, (_counts([0, 0, 3], kfloat),
                                          np.array([-INF, 0.0, -INF])), (1,))
    assert plain == -INF and vg == -INF
    np.testing.assert_array_equal(d[:2], [0.0, -1.0])
    assert d[2] == 3.0  # the limit of k - exp(eta) (docs/kernels.md, Edges)
    plain, vg, (d,) = value_and_grads(f, (_counts(np.zeros(3), kfloat), -INF), (1,))
    assert plain == 0.0 and vg == 0.0 and d == 0.0


@poisson_forms
@normalized_both
@pytest.mark.parametrize("ks, ps", [((0,), ()), ((0,), (0,)), ((0, 3), (3,)), ((), (0,)),
                                    ((2, 0), (1, 0))])
def test_poisson_empty_inputs(form, normalized, ks, ps):
    f, _ = _poisson(form, normalized)
    k, param = np.zeros(ks, int), np.ones(ps)
    plain, vg, (d,) = value_and_grads(f, (k, param), (1,))
    assert plain == 0.0 and vg == 0.0
    assert d.shape == param.shape and d.dtype == param.dtype
    np.testing.assert_array_equal(d, np.zeros(ps))


@poisson_forms
@kinds_both
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_poisson_unnormalized_drops_log_factorial(form, kfloat, dtype, tol):
    """normalized=False is scipy's log-mass plus log k!, with the same gradient."""
    t = tol(dtype)
    f, to_param = POISSONS[form]
    k = np.array([[0, 1, 5], [20, 150, 1000]], np.float32 if kfloat else np.int32)
    param = np.asarray(to_param(np.array([0.5, 3.0, 200.0])), dtype)
    k64 = k.astype(np.float64)
    rate64 = np.asarray(param, np.float64)
    rate64 = np.exp(rate64) if form == "log_rate" else rate64
    mag = np.abs(scipy.special.xlogy(k64, rate64)) + rate64
    want = (scipy.stats.poisson.logpmf(k64, rate64) + scipy.special.gammaln(k64 + 1.0)).sum()
    prop_f = lambda k, p: f(k, p, normalized=False)  # noqa: E731
    plain, vg, (g_prop,) = value_and_grads(prop_f, (k, param), (1,))
    assert plain.dtype == vg.dtype == g_prop.dtype == dtype
    np.testing.assert_allclose(plain, want, rtol=t["value"], atol=t["value"] * mag.sum())
    np.testing.assert_allclose(vg, want, rtol=t["value"], atol=t["value"] * mag.sum())
    g_full = jax.grad(f, argnums=1)(k, param)
    np.testing.assert_array_equal(g_full, g_prop)


@poisson_forms
def test_poisson_float32_small_counts_within_an_ulp(form):
    """rate 1 (log-rate 0): the value is -1 - log k!, to within one float32 ulp of the
    correctly rounded number (Loader's form sums four rounded pieces)."""
    f, to_param = POISSONS[form]
    one = np.float32(to_param(1.0))
    v = f(0, one)
    assert v.dtype == np.float32 and v == np.float32(-1.0)
    for k in range(0, 21):
        want = np.float32(-1.0 - math.lgamma(k + 1.0))
        got = f(k, one)
        assert got.dtype == np.float32
        np.testing.assert_array_max_ulp(np.float32(got), want, maxulp=1)
        got_f = f(np.float32(k), one)  # float32 counts take the same path
        assert got_f == got, (k, float(got_f), float(got))


@poisson_forms
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_poisson_counts_around_and_beyond_the_table(form, dtype, tol):
    f, to_param = POISSONS[form]
    k = np.array([30, 31, 32, 33, 126, 127, 128, 129, 150, 1000, 10_000, 123_456])
    rate = np.array([25.0, 1.0, 40.0, 33.0, 100.0, 130.0, 128.0, 1.0, 1e-3, 1e3, 9_000.0,
                     1.2e5])
    param = np.asarray(to_param(rate), dtype)
    rate64 = np.exp(np.asarray(param, np.float64)) if form == "log_rate" else np.asarray(
        param, np.float64)
    terms = scipy.stats.poisson.logpmf(k, rate64)
    mag = (np.abs(scipy.special.xlogy(k, rate64)) + rate64 + scipy.special.gammaln(k + 1.0))
    got = f(k, param)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, terms.sum(), rtol=tol(dtype)["value"],
                               atol=tol(dtype)["value"] * mag.sum())
    # elementwise too, so that no single count is off
    for i in range(len(k)):
        np.testing.assert_allclose(f(k[i], param[i]), terms[i], rtol=tol(dtype)["value"],
                                   atol=tol(dtype)["value"] * mag[i], err_msg=f"k={k[i]}")


@poisson_forms
@pytest.mark.parametrize("counts", ["all_below_32", "some_beyond", "off_support_float"])
def test_poisson_large_n_log_factorial_branches(form, counts, rng, tol):
    """Above fusedlp._xla.SMALL_POISSON_TABLE counts a normalized kernel's value is the branch of a
    cond on max(k) < 32 (the table alone, or table and Stirling); both branches, and an
    off-support float count (which must send the max to the full formula), against scipy
    and autodiff of jax.scipy.stats, value and gradient."""
    f, to_param = POISSONS[form]
    n = 1000
    assert n > fusedlp._xla.SMALL_POISSON_TABLE
    k = rng.poisson(3.0, n).astype(np.int32)
    if counts == "some_beyond":
        k[::97] = rng.integers(32, 5000, len(k[::97]))
    rate = rng.uniform(0.5, 6.0, n)
    param = to_param(rate)
    kk = k.astype(np.float64)
    if counts == "off_support_float":
        kk[5], kk[700] = 2.5, -1.0
        k = kk
    v, d = jax.value_and_grad(f, argnums=1)(k, param)
    ok = (kk >= 0) & (kk == np.floor(kk))
    if counts == "off_support_float":
        assert v == -np.inf and d[5] == 0.0 and d[700] == 0.0
        d_in = jax.grad(f, argnums=1)(kk[ok], param[ok])
        np.testing.assert_allclose(np.asarray(d)[ok], d_in, rtol=tol(np.float64)["grad"])
        return
    want = scipy.stats.poisson.logpmf(k, rate).sum()
    np.testing.assert_allclose(v, want, rtol=tol(np.float64)["value"])
    to_rate = jnp.exp if form == "log_rate" else (lambda p: p)
    dplain = jax.grad(lambda p: jnp.sum(jsp_stats.poisson.logpmf(kk, to_rate(p))))(param)
    np.testing.assert_allclose(d, dplain, rtol=tol(np.float64)["grad"])


@poisson_forms
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_poisson_log_factorial_sweep(form, dtype, tol):
    """At rate 1 (log-rate 0) the value is -1 - log k!: every k, whatever the method."""
    f, to_param = POISSONS[form]
    big = [1000, 4999, 5000, 65_536, 1_000_000] + ([1e9, 1e12] if dtype == np.float64 else [])
    k = np.concatenate([np.arange(0, 300), big]).astype(dtype)
    got = np.asarray(jax.vmap(lambda k: f(k, dtype(to_param(1.0))))(k))
    assert got.dtype == dtype
    ref = -1.0 - scipy.special.gammaln(np.asarray(k, np.float64) + 1.0)
    np.testing.assert_allclose(got, ref, rtol=tol(dtype)["value"])


@poisson_forms
@pytest.mark.parametrize("kdtype", [np.int32, np.int64, np.uint8])
def test_poisson_integer_counts(form, kdtype):
    """Integer k: the result takes the parameter's float dtype; no cotangent, no error."""
    f, to_param = POISSONS[form]
    k = np.array([0, 3, 7], kdtype)
    param = np.asarray(to_param(np.array([0.5, 2.0, 6.0])), np.float32)
    v, d = jax.value_and_grad(f, argnums=1)(k, param)
    assert v.dtype == np.float32 and d.dtype == np.float32 and d.shape == (3,)
    assert f(k, param.astype(np.float64)).dtype == np.float64
    assert f(3, np.float32(param[1])).dtype == np.float32  # python int
    # the cotangent of an integer k is a float0 zero (no cotangent at all)
    _, vjp = jax.vjp(f, k, param)
    ck, cp = vjp(jnp.ones((), np.float32))
    assert ck.dtype == jax.dtypes.float0 and ck.shape == k.shape
    np.testing.assert_array_equal(cp, d)


@poisson_forms
def test_poisson_float_counts_get_zero_cotangent(form):
    f, to_param = POISSONS[form]
    k = np.array([0.0, 3.0, 7.0])
    param = to_param(np.array([0.5, 2.0, 6.0]))
    dk, _ = jax.grad(f, argnums=(0, 1))(k, param)
    assert dk.dtype == k.dtype
    np.testing.assert_array_equal(dk, np.zeros(3))
    dk32 = jax.grad(f, argnums=0)(k.astype(np.float32), param)
    assert dk32.dtype == np.float32
    np.testing.assert_array_equal(dk32, np.zeros(3))


@poisson_forms
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [50, 5000])  # the exact pass alone, and the fast pass
def test_poisson_counts_known_at_trace_time_give_what_traced_counts_give(form, dtype, n, rng):
    """Counts closed over by the caller have Loader's data-only part summed once, when the
    kernel is traced (poisson._data_sum): the same value and gradient as counts passed as
    jit arguments, also when broadcasting repeats each count, and still -inf with a zero
    partial off the support; above the exact pass's size, the per-call program is smaller."""
    f, to_param = POISSONS[form]
    k = rng.poisson(30.0, size=n)
    k[:3] = [0, 1, 1000]
    param = jnp.asarray(to_param(rng.uniform(5.0, 50.0, size=(2, n))), dtype)
    closed = jax.jit(jax.value_and_grad(lambda p: f(k, p)))
    traced = jax.jit(jax.value_and_grad(lambda p, k: f(k, p)))
    (v1, g1), (v2, g2) = closed(param), traced(param, jnp.asarray(k))
    rtol = 1e-13 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(v1, v2, rtol=rtol)
    np.testing.assert_allclose(g1, g2, rtol=rtol)
    closed_ops = sum(count_primitives(jax.make_jaxpr(lambda p: f(k, p))(param).jaxpr).values())
    traced_ops = sum(count_primitives(
        jax.make_jaxpr(lambda p, k: f(k, p))(param, k).jaxpr).values())
    assert closed_ops < traced_ops or _xla.below(n, _xla.SMALL)
    off = np.where(np.arange(n) == 5, -2, k)
    v, g = jax.jit(jax.value_and_grad(lambda p: f(off, p)))(param)
    assert v == -np.inf and np.all(g[:, 5] == 0) and np.all(np.isfinite(g))


# fuse-built kernels with a data-only part (fuse's data_term): each maps (data, parameter,
# normalized) to the kernel's value; the data are a tuple of count arrays.
DATA_TERM_KERNELS = {
    "negative_binomial": (
        lambda d, p, norm: fusedlp.negative_binomial_lpmf(d[0], p, 4.0, normalized=norm),
        lambda rng, n: (rng.poisson(30.0, size=n),)),
    "binomial_logit": (
        lambda d, p, norm: fusedlp.binomial_logit_lpmf(d[0], d[1], jnp.log(p) - 3.0,
                                                       normalized=norm),
        lambda rng, n: (lambda t: (rng.binomial(t, 0.4), t))(rng.integers(1, 60, size=n))),
}


@pytest.mark.parametrize("name", DATA_TERM_KERNELS)
@pytest.mark.parametrize("normalized", [True, False])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [50, 5000])  # the exact pass alone, and the fast pass
def test_fuse_data_known_at_trace_time_give_what_traced_data_give(name, normalized, dtype, n,
                                                                  rng):
    """Data closed over by the caller have the fast form's data-only part summed once, when
    the kernel is traced (fuse's data_term): the same value and gradient as data passed as
    jit arguments, also when broadcasting repeats each element, and still -inf with a zero
    partial off the support; above the exact pass's size, the per-call program is smaller."""
    f, make = DATA_TERM_KERNELS[name]
    data = make(rng, n)
    param = jnp.asarray(rng.uniform(5.0, 50.0, size=(2, n)), dtype)
    closed = jax.jit(jax.value_and_grad(lambda p: f(data, p, normalized)))
    traced = jax.jit(jax.value_and_grad(lambda p, d: f(d, p, normalized)))
    (v1, g1), (v2, g2) = closed(param), traced(param, tuple(map(jnp.asarray, data)))
    rtol = 1e-13 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(v1, v2, rtol=rtol)
    np.testing.assert_allclose(g1, g2, rtol=rtol)
    closed_ops = sum(count_primitives(
        jax.make_jaxpr(lambda p: f(data, p, normalized))(param).jaxpr).values())
    traced_ops = sum(count_primitives(
        jax.make_jaxpr(lambda p, d: f(d, p, normalized))(param, data).jaxpr).values())
    assert closed_ops < traced_ops or _xla.below(n, _xla.SMALL)
    off = (np.where(np.arange(n) == 5, -2, data[0]), *data[1:])
    v, g = jax.jit(jax.value_and_grad(lambda p: f(off, p, normalized)))(param)
    assert v == -np.inf and np.all(g[:, 5] == 0) and np.all(np.isfinite(g))


# =================================================================================== EAM


@pytest.mark.parametrize(
    "amp, beta, coeffs",
    [
        (0.0, 3.0, SEED_EMBEDDING),
        (-0.1, 3.0, SEED_EMBEDDING),
        (INF, 3.0, SEED_EMBEDDING),
        (NAN, 3.0, SEED_EMBEDDING),
        (0.05, 0.0, SEED_EMBEDDING),
        (0.05, -2.0, SEED_EMBEDDING),
        (0.05, INF, SEED_EMBEDDING),
        (0.05, NAN, SEED_EMBEDDING),
        (0.05, 3.0, (0.0, 1.0, INF, 0.25)),
        (0.05, 3.0, (0.0, -INF, 1.0, 0.25)),
        (0.05, 3.0, (NAN, 1.0, 1.0, 0.25)),
    ],
    ids=["A0", "A-neg", "A-inf", "A-nan", "beta0", "beta-neg", "beta-inf", "beta-nan",
         "c-inf", "c-minus-inf", "c-nan"],
)
def test_eam_invalid_params_give_nan(amp, beta, coeffs):
    r = np.array([[0.2, 1.0, 1.5], [0.7, 0.1, 2.0]])
    coeffs = np.array(coeffs)
    plain, vg, grads = value_and_grads(eam, (r, amp, beta, coeffs), (0, 1, 2, 3))
    assert np.isnan(plain) and np.isnan(vg)
    for g in grads:
        assert np.all(np.isnan(g))


def test_eam_nan_distance_gives_nan():
    r = np.array([[0.2, NAN, 1.5], [0.7, 0.1, 2.0]])
    plain, vg, _ = value_and_grads(eam, (r,), (0,))
    assert np.isnan(plain) and np.isnan(vg)


@pytest.mark.parametrize("dtype, very_negative", [(np.float64, -1000.0), (np.float32, -100.0),
                                                  (np.float64, -1e300)])
def test_eam_overflow_is_plus_inf_not_nan(dtype, very_negative, tol):
    r = np.array([[very_negative, 1.0, 0.5], [0.3, 0.9, 1.2]], dtype)
    plain, vg, grads = value_and_grads(
        eam, (r, dtype(SEED_DENSITY[0]), dtype(SEED_DENSITY[1]), np.asarray(SEED_EMBEDDING, dtype)),
        (0, 1, 2, 3),
    )
    assert plain == INF and vg == INF
    assert plain.dtype == dtype
    for g in grads:
        assert not np.any(np.isnan(g))
    # the other site is untouched
    dr = grads[0]
    np.testing.assert_allclose(dr[1], jax.grad(eam)(r[1:])[0], rtol=tol(dtype)["grad"])
    # p that overflows only in F (not in exp) is +inf too
    assert eam(np.array([-200.0, -200.0])) == INF


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0), (2, 0, 5)])
def test_eam_empty_inputs(shape):
    r = np.zeros(shape)
    coeffs = np.array(SEED_EMBEDDING)
    amp, beta = np.float64(SEED_DENSITY[0]), np.float64(SEED_DENSITY[1])
    plain, vg, (dr, da, db, dc) = value_and_grads(eam, (r, amp, beta, coeffs), (0, 1, 2, 3))
    assert plain == 0.0 and vg == 0.0
    assert dr.shape == shape and dr.dtype == np.float64
    assert da.shape == () and db.shape == () and dc.shape == (4,)
    assert da == 0.0 and db == 0.0
    np.testing.assert_array_equal(dc, np.zeros(4))


# Above fusedlp._xla.SMALL_NORMAL elements the scalar-scale path reduces without selects and
# decides the edges in a second pass only when the sum is not finite (lax.cond); the tests
# above use small arrays, so these exercise that path, eagerly and under jit.
@pytest.mark.parametrize("case", ["finite", "x_inf", "loc_inf", "loc_nan"])
@pytest.mark.parametrize("scalar_loc", [True, False], ids=["scalar-loc", "array-loc"])
def test_normal_large_n_edge_path(case, scalar_loc, rng):
    from fusedlp._xla import SMALL_NORMAL as _SMALL

    n = _SMALL + 101
    x = rng.normal(size=n)
    loc = np.float64(0.25) if scalar_loc else rng.normal(size=n) * 0.1
    scale = np.float64(1.7)
    if case == "x_inf":
        x[17] = INF
    elif case in ("loc_inf", "loc_nan"):
        if scalar_loc:
            loc = np.float64(INF if case == "loc_inf" else NAN)
        else:
            loc = loc.copy()
            loc[n - 3] = INF if case == "loc_inf" else NAN
    plain, value, (dx, dloc, dscale) = value_and_grads(fusedlp.normal_lpdf, (x, loc, scale),
                                                       (0, 1, 2))
    if case in ("loc_inf", "loc_nan"):
        assert np.isnan(plain) and np.isnan(value)
        return
    off = np.isinf(x)
    z = np.where(off, 0.0, (x - loc) / scale)
    if case == "x_inf":
        assert plain == -np.inf and value == -np.inf
    else:
        ref = scipy.stats.norm.logpdf(x, loc, scale).sum()
        np.testing.assert_allclose([plain, value], [ref, ref], rtol=1e-12)
    np.testing.assert_allclose(dx, -z / scale, rtol=1e-12, atol=1e-300)
    dloc_ref = z / scale if not scalar_loc else (z / scale).sum()
    np.testing.assert_allclose(dloc, dloc_ref, rtol=1e-10)
    np.testing.assert_allclose(dscale, ((z * z - 1.0) / scale)[~off].sum(), rtol=1e-10)
    # with x undifferentiated the scalar partials come from the sums (the fitting path)
    if scalar_loc:
        dl, ds = jax.jit(jax.grad(fusedlp.normal_lpdf, argnums=(1, 2)))(x, loc, scale)
        np.testing.assert_allclose([dl, ds], [dloc_ref, dscale], rtol=1e-10)


# ============================================= found in review: combinations and 2nd order


@pytest.mark.parametrize("n", [5, 20_000], ids=["small", "large"])
@pytest.mark.parametrize("argnums", [1, (1, 2)], ids=["loc", "loc+scale"])
def test_normal_scalar_loc_with_array_scale(n, argnums, rng, tol):
    """A scalar loc with an array scale, x not differentiated: d/dloc = sum (x - mu)/sigma^2.

    (The scalar-loc sum used to exist only on the scalar-scale path, and this combination
    returned exactly 0.)"""
    x, scale = rng.normal(size=n), rng.uniform(0.5, 2.0, size=n)

    def plain(x, loc, scale):
        return jnp.sum(-0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale)
                       - 0.5 * math.log(2 * math.pi))

    got = jax.grad(fusedlp.normal_lpdf, argnums=argnums)(x, 0.3, scale)
    want = jax.grad(plain, argnums=argnums)(x, 0.3, scale)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=tol(np.float64)["grad"])
    h = fusedlp.hessian(fusedlp.normal_lpdf, argnums=1)(x, 0.3, scale)
    np.testing.assert_allclose(h, -np.sum(1 / scale**2), rtol=1e-12)
    # an invalid scale anywhere makes the scalar loc's gradient NaN
    bad = scale.copy()
    bad[n // 2] = -1.0
    assert np.isnan(jax.grad(fusedlp.normal_lpdf, argnums=1)(x, 0.3, bad))


def _without(a, i):
    return a if np.ndim(a) == 0 else np.delete(a, i)


# The size matters for a scalar scale only (above fusedlp._xla.SMALL_NORMAL its sums take a
# lax.cond); an array scale's Hessian is N x N, so it stays small.
@pytest.mark.parametrize("n, array_scale", [(5, False), (20_000, False), (5, True), (300, True)],
                         ids=["scalar-scale-small", "scalar-scale-large", "array-scale-small",
                              "array-scale-300"])
def test_normal_hessian_ignores_out_of_support_elements(n, array_scale, rng):
    """x = +-inf contributes a zero gradient, so nothing to the second derivatives either
    (not inf * 0 = NaN from the branch the rule selects away)."""
    x = rng.normal(size=n)
    x[n // 2] = INF
    scale = rng.uniform(0.5, 2.0, size=n) if array_scale else 1.5
    h = fusedlp.hessian(fusedlp.normal_lpdf, argnums=(1, 2))(x, 0.0, scale)
    h_ref = fusedlp.hessian(fusedlp.normal_lpdf, argnums=(1, 2))(
        _without(x, n // 2), 0.0, _without(scale, n // 2))
    for i in range(2):
        for j in range(2):
            got, want = np.asarray(h[i][j]), np.asarray(h_ref[i][j])
            assert np.all(np.isfinite(got)), (i, j)
            if got.shape != want.shape:  # an array scale: the removed element's row is 0
                got = np.delete(got, n // 2, axis=-1) if got.ndim == 1 else np.delete(
                    np.delete(got, n // 2, axis=0), n // 2, axis=1)
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel, params", [
    ("poisson_log_lpmf", [-800.0, -2.0, 0.0, 1.5, 700.0, INF, -INF, NAN]),
    ("poisson_lpmf", [0.0, 1e-300, 0.5, 3.0, 1e300, INF, -1.0, NAN])])
@pytest.mark.parametrize("edge, dtype", [
    ([0], "int64"), ([-3], "int64"), ([0], "float64"), ([-3], "float64"), ([2.5], "float64"),
    ([INF], "float64"), ([NAN], "float64")])
def test_propto_scalar_parameter_sums_as_the_broadcast_vector(kernel, params, edge, dtype,
                                                              rng):
    """normalized=False with a scalar parameter is linear in the counts and is summed as
    eta * sum(k) - n * rate; it gives what the same parameter broadcast to a vector gives
    (per-element terms), edges included, above the select-free path's threshold."""
    k = np.concatenate([rng.poisson(3.0, 2 * _xla.SMALL), edge]).astype(dtype)
    f = getattr(fusedlp, kernel)
    for p in params:
        vs, gs = jax.value_and_grad(lambda q: f(k, q, normalized=False))(p)
        vv, gv = jax.value_and_grad(lambda q: f(k, q, normalized=False))(np.full(k.shape, p))
        np.testing.assert_allclose([vs, gs], [vv, np.sum(gv)], rtol=1e-12, err_msg=f"{p}")


@pytest.mark.parametrize("n", [5, 20_000], ids=["small", "large"])
def test_poisson_hessian_ignores_out_of_support_float_counts(n, rng):
    k = rng.poisson(2.0, size=n).astype(float)
    k[1] = INF
    k[2] = -1.0
    k[3] = 2.5
    h = fusedlp.hessian(fusedlp.poisson_lpmf, argnums=1)(k, 2.0)
    kept = np.delete(k, [1, 2, 3])
    np.testing.assert_allclose(h, -kept.sum() / 4.0, rtol=1e-12)


def test_eam_infinite_distance_is_a_neighbour_that_contributes_nothing(tol):
    """r = +inf (padding by distance instead of a mask): e = 0, so no term and a zero
    gradient, for r and for beta (r e = inf * 0 must not become NaN)."""
    r = np.array([0.1, 0.4, INF, 0.7])
    f = lambda r, b: eam(r, amp=0.05, beta=b)  # noqa: E731
    value, (dr, db) = jax.value_and_grad(f, argnums=(0, 1))(r, 3.0)
    value_ref, (dr_ref, db_ref) = jax.value_and_grad(f, argnums=(0, 1))(np.delete(r, 2), 3.0)
    np.testing.assert_allclose(value, value_ref, rtol=tol(np.float64)["value"])
    assert dr[2] == 0.0
    np.testing.assert_allclose(np.delete(np.asarray(dr), 2), dr_ref, rtol=tol(np.float64)["grad"])
    np.testing.assert_allclose(db, db_ref, rtol=tol(np.float64)["grad"])


def test_eam_infinite_distance_has_the_hessian_of_dropping_it(tol):
    """The same padding under fusedlp.hessian and jax.hessian: the second derivatives in r,
    A and beta equal those without the padded neighbour (they were NaN: the beta-tangent
    of exp(-beta r) at r = +inf is inf * 0)."""
    r = np.array([0.1, 0.4, INF, 0.7])
    f = lambda r, a, b: eam(r, amp=a, beta=b)  # noqa: E731
    # an r = +inf that a mask keeps is masked too (its beta-tangent was NaN there)
    kept = lambda a, b: fusedlp.eam_energy(r, density=(a, b), mask=np.ones(4, bool))  # noqa: E731
    np.testing.assert_allclose(
        fusedlp.hessian(kept, (0, 1))(0.05, 3.0),
        fusedlp.hessian(lambda a, b: f(np.delete(r, 2), a, b), (0, 1))(0.05, 3.0),
        rtol=tol(np.float64)["grad"])
    for hess in (fusedlp.hessian, jax.hessian):
        got = hess(f, argnums=(0, 1, 2))(r, 0.05, 3.0)
        want = hess(f, argnums=(0, 1, 2))(np.delete(r, 2), 0.05, 3.0)
        h_rr = np.asarray(got[0][0])
        assert np.all(h_rr[2] == 0.0) and np.all(h_rr[:, 2] == 0.0)
        np.testing.assert_allclose(np.delete(np.delete(h_rr, 2, 0), 2, 1), want[0][0],
                                   rtol=tol(np.float64)["grad"])
        for i in (1, 2):
            assert np.asarray(got[i][0])[2] == 0.0
            np.testing.assert_allclose(np.delete(np.asarray(got[i][0]), 2), want[i][0],
                                       rtol=tol(np.float64)["grad"])
            for j in (1, 2):
                np.testing.assert_allclose(got[i][j], want[i][j], rtol=tol(np.float64)["grad"])


def test_eam_overflow_next_to_underflow_has_no_nan_gradient():
    """One neighbour overflows the density (F'(p) = inf), another underflows it (e = 0):
    the value is +inf, the overflowing r gets -inf, the underflowed one 0, never NaN."""
    value, dr = jax.value_and_grad(lambda r: eam(r, amp=0.05, beta=3.0))(
        np.array([-400.0, 300.0]))
    assert value == INF
    assert dr[0] == -INF and dr[1] == 0.0


def test_empty_inputs_give_zero_whatever_the_parameters():
    """No element, no verdict: every kernel gives exactly 0 on empty data, also with an
    invalid parameter (as scipy's sum over no elements), and zero gradients."""
    empty = np.zeros(0)
    assert fusedlp.normal_lpdf(empty, 0.0, -1.0) == 0.0
    assert fusedlp.normal_lpdf(empty, np.nan, np.ones(0)) == 0.0
    g = jax.grad(fusedlp.normal_lpdf, argnums=(1, 2))(empty, 0.0, -1.0)
    assert g == (0.0, 0.0)
    assert fusedlp.poisson_lpmf(empty, -1.0) == 0.0
    assert fusedlp.poisson_log_lpmf(empty, np.inf) == 0.0
    assert fusedlp.student_t_lpdf(empty, -1.0) == 0.0
    assert eam(np.zeros((3, 0)), amp=-1.0) == 0.0
    g = jax.grad(lambda a, r: eam(r, amp=a), argnums=(0, 1))(np.nan, np.zeros((3, 0)))
    assert g[0] == 0.0 and g[1].shape == (3, 0)


@pytest.mark.parametrize("edge", [True, False], ids=["one_edge_member", "all_finite"])
@pytest.mark.parametrize("batch", ["3x3000", "3x3000_blocks", "64x40", "64x40_member_blocks"])
@pytest.mark.parametrize("kernel", ["poisson_lpmf", "poisson_log_lpmf", "negative_binomial_lpmf",
                                    "student_t_lpdf", "gamma_lpdf", "binomial_logit_lpmf"])
def test_vmapped_batch_with_one_edge_member_matches_each_member(kernel, batch, edge, rng,
                                                                xla_setting):
    """Under vmap one verdict serves the batch (fusedlp._xla): a member with an element off
    the support sends the whole batch to the exact pass. Each member's value and gradient
    are still its own, as computed unbatched: for members above fusedlp._xla.SMALL, their
    exact pass whole or (a block smaller than a member) in blocks of each member; for members
    below it, whose batch is above it, so that the fast form runs for the batch and the
    exact pass behind it over all members at once or (a block of 25 members) over blocks
    of whole members, the last overlapping the one before (fusedlp._xla.blockwise's
    batching rule)."""
    b, n = (64, 40) if batch.startswith("64x40") else (3, 3000)
    if batch.endswith("blocks"):
        xla_setting("BLOCK", 1000)
    k = rng.poisson(3.0, (b, n)).astype(np.float64)
    if edge:
        k[1, 5] = 2.5  # off the support: -inf, zero partial
    fn = getattr(fusedlp, kernel)
    call = {
        "poisson_lpmf": lambda p, k: fn(k, p),
        "poisson_log_lpmf": lambda p, k: fn(k, p),
        "negative_binomial_lpmf": lambda p, k: fn(k, p, 2.0),
        "student_t_lpdf": lambda p, k: fn(jnp.where(k == 2.5, jnp.inf, k), 5.0, p, 1.5),
        "gamma_lpdf": lambda p, k: fn(jnp.where(k == 2.5, -1.0, k + 0.5), 2.5, p),
        "binomial_logit_lpmf": lambda p, k: fn(k, jnp.floor(k) + 2.0, p - 3.0),
    }[kernel]
    p = np.full((b, n), 2.0) + 0.1 * rng.normal(size=(b, n))
    values, grads = jax.vmap(jax.value_and_grad(call))(p, k)
    member = jax.jit(jax.value_and_grad(call))  # one member, unbatched: compiled once
    for i in range(b):
        v, g = member(p[i], k[i])
        np.testing.assert_allclose(values[i], v, rtol=1e-12)
        np.testing.assert_allclose(grads[i], g, rtol=1e-12, atol=1e-12)
    values = np.asarray(values)
    assert values[1] == -np.inf if edge else np.isfinite(values[1])
    assert np.all(np.isfinite(values[[0, 2]]))
