"""fusedlp.fuse: user-written one-element densities become summed kernels with fused VJPs.

References are independent of fuse: ``jnp.sum`` of the same element function over the
broadcast arrays, differentiated by ordinary autodiff, and finite differences.
"""

from __future__ import annotations

import functools
import math

import _helpers
import chex
import jax
import jax.extend.core
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import pytest
from _helpers import grad_primitive_counts
from jax.test_util import check_grads

import fusedlp
from fusedlp._fuse import _arithmetic_only, _layout, _Spec, kernel

# edge tests here compare infinities on purpose
assert_close = functools.partial(_helpers.assert_close, require_finite=False)

NAN, INF = float("nan"), float("inf")
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def normal_element(x, loc=0.0, scale=1.0, *, normalized=True):
    z = (x - loc) / scale
    lp = -0.5 * z * z - jnp.log(scale)
    return lp - HALF_LOG_2PI if normalized else lp


def zip_element(k, rate, pi):
    """Zero-inflated Poisson: P(0) = pi + (1 - pi) e^-rate, P(k) = (1 - pi) Pois(k | rate)."""
    log_pois = jsp.xlogy(k, rate) - rate - jsp.gammaln(k + 1.0)
    zero = jnp.logaddexp(jnp.log(pi), jnp.log1p(-pi) - rate)
    return jnp.where(k == 0, zero, jnp.log1p(-pi) + log_pois)


def laplace_element(x, loc, scale):
    return -jnp.abs(x - loc) / scale - jnp.log(2.0 * scale)


def cauchy_element(x, loc, scale):
    z = (x - loc) / scale
    return -jnp.log1p(z * z) - jnp.log(scale) - math.log(math.pi)


fused_normal = fusedlp.fuse(normal_element)
fused_cauchy = fusedlp.fuse(cauchy_element)
fused_zip = fusedlp.fuse(zip_element, data=("k",))
fused_laplace = fusedlp.fuse(laplace_element)


def plain_sum(element, *args, **kw):
    """The reference: sum of the element function over the broadcast (plain jnp, autodiff)."""
    shape = jnp.broadcast_shapes(*(jnp.shape(a) for a in args))
    flat = [jnp.ravel(jnp.broadcast_to(a, shape)) for a in args]
    return jnp.sum(jax.vmap(lambda *e: element(*e, **kw))(*flat))


SHAPES = [((), (), ()), ((6,), (), ()), ((3, 4), (4,), ()), ((3, 1), (1, 4), (3, 4)),
          ((), (5,), (5,))]


@pytest.mark.parametrize("shapes", SHAPES[1:], ids=str)
def test_normal_value_and_grads_against_autodiff(shapes, dtype, rng, tol):
    t = tol(dtype)
    x = rng.normal(0, 2, shapes[0]).astype(dtype)
    loc = rng.normal(0, 1, shapes[1]).astype(dtype)
    scale = rng.uniform(0.5, 2, shapes[2]).astype(dtype)
    value, grads = jax.value_and_grad(fused_normal, argnums=(0, 1, 2))(x, loc, scale)
    x64, l64, s64 = (np.asarray(a, np.float64) for a in (x, loc, scale))
    want_v, want_g = jax.value_and_grad(
        lambda *a: plain_sum(normal_element, *a), argnums=(0, 1, 2))(x64, l64, s64)
    assert value.dtype == dtype and value.shape == ()
    assert_close(value, want_v, t["value"] * 10, what="value")
    assert_close(fused_normal(x, loc, scale), want_v, t["value"] * 10, what="plain call value")
    for a, g, w in zip((x, loc, scale), grads, want_g):
        assert g.shape == a.shape and g.dtype == dtype
        assert_close(g, w, t["grad"], what="grad")


@pytest.mark.parametrize("shapes", [SHAPES[0], SHAPES[3]], ids=str)
@pytest.mark.parametrize("order", [1, 2])
def test_check_grads(shapes, order, rng, tol):
    t = tol(np.float64)
    k = rng.poisson(1.0, shapes[0]).astype(np.float64)
    rate = rng.uniform(0.5, 3.0, shapes[1])
    pi = rng.uniform(0.1, 0.6, shapes[2])
    check_grads(lambda r, p: fused_zip(k, r, p), (rate, pi), order=order, modes=["rev"],
                eps=t["fd_eps"], atol=t["fd_atol"], rtol=t["fd_rtol"])
    x = rng.normal(size=shapes[0])
    check_grads(lambda *a: fused_normal(*a), (x, rate, pi + 0.5), order=order, modes=["rev"],
                eps=t["fd_eps"], atol=t["fd_atol"], rtol=t["fd_rtol"])


def test_user_density_against_autodiff_and_hessian(rng, tol):
    t = tol(np.float64)
    k = rng.poisson(1.5, 50).astype(np.int32)
    k[:10] = 0
    rate, pi = np.float64(1.7), np.float64(0.3)
    v, g = jax.value_and_grad(fused_zip, argnums=(1, 2))(k, rate, pi)
    wv, wg = jax.value_and_grad(lambda r, p: plain_sum(zip_element, k.astype(float), r, p),
                                argnums=(0, 1))(rate, pi)
    assert_close(v, wv, t["value"], what="value")
    for a, b in zip(g, wg):
        assert_close(a, b, t["grad"], what="grad")
    h = jax.jit(fusedlp.hessian(fused_zip, argnums=(1, 2)))(k, rate, pi)
    wh = jax.hessian(lambda r, p: plain_sum(zip_element, k.astype(float), r, p),
                     argnums=(0, 1))(rate, pi)
    for a, b in zip(jax.tree_util.tree_leaves(h), jax.tree_util.tree_leaves(wh)):
        assert_close(a, b, t["grad"], what="hessian")


@pytest.mark.parametrize("n", [3, 5000])
def test_user_density_hessian_ignores_elements_outside_the_support(n, rng, tol):
    """The edge rule on second partials: an element whose log-density is -inf adds nothing
    to the Hessian, even where f's own second derivative there is not finite (a^2 log x at
    x = 0: reverse mode through the forward rule's code once gave NaN)."""
    @fusedlp.fuse
    def f(x, a, b):
        return jnp.where(x >= 0, a * a * jnp.log(x) - b * x + jnp.log(b), -jnp.inf)

    x = rng.uniform(0.5, 2.0, n)
    x[1] = 0.0  # log-density -inf: a > 0 and log 0
    x[2] = -1.0  # outside the support
    inside = np.ones(n, bool)
    inside[1:3] = False
    p = jnp.array([2.0, 1.5])
    h_all = jax.jit(fusedlp.hessian(lambda p: f(x, p[0], p[1])))(p)
    h_in = jax.jit(fusedlp.hessian(lambda p: f(x[inside], p[0], p[1])))(p)
    assert np.all(np.isfinite(h_all)), h_all
    assert_close(h_all, h_in, tol(np.float64)["grad"], what="hessian")


def test_decorator_forms_defaults_and_static_options(rng, tol):
    t = tol(np.float64)
    x = rng.normal(size=5)

    @fusedlp.fuse
    def f(x, loc=0.0, scale=1.0, *, normalized=True):
        return normal_element(x, loc, scale, normalized=normalized)

    @fusedlp.fuse(name="my_normal")
    def h(x, loc, scale):
        return normal_element(x, loc, scale)

    assert f.__name__ == "f" and h.__name__ == "h"
    want = plain_sum(normal_element, x, 0.0, 1.0)
    assert_close(f(x), want, t["value"])
    assert_close(f(x, scale=1.0), want, t["value"])
    assert_close(f(x, 0.0, 1.0), want, t["value"])
    assert_close(h(x, 0.0, 1.0), want, t["value"])
    prop = f(x, 0.3, 2.0, normalized=False)
    assert_close(f(x, 0.3, 2.0) - prop, -5 * HALF_LOG_2PI, t["value"])
    g1 = jax.grad(f, argnums=(1, 2))(x, 0.3, 2.0)
    g2 = jax.grad(lambda *a: f(*a, normalized=False), argnums=(1, 2))(x, 0.3, 2.0)
    np.testing.assert_array_equal(g1, g2)
    with pytest.raises(ValueError, match="my_normal: argument `scale`"):
        h(x, 0.0, np.ones(4))


def test_edge_rule_zero_gradient_off_support_nan_for_invalid():
    @fusedlp.fuse
    def expo(x, rate):
        # log x would be -inf at x = 0, with derivative inf; the where hides the value only
        lp = jnp.log(rate) - rate * x + 0.0 * jnp.log(x)
        lp = jnp.where(x < 0, -jnp.inf, lp)
        return jnp.where(rate > 0, lp, jnp.nan)

    x = np.array([1.0, -2.0, 0.5])
    v, (dx, dr) = jax.value_and_grad(expo, argnums=(0, 1))(x, np.array([2.0, 2.0, 2.0]))
    dx, dr = np.asarray(dx), np.asarray(dr)
    assert v == -INF
    assert dx[1] == 0.0 and dr[1] == 0.0  # off support: zero, never NaN
    np.testing.assert_allclose(np.asarray(dr)[[0, 2]], 1 / 2.0 - x[[0, 2]])
    # a scalar rate: the off-support element contributes nothing to the sum
    _, dr = jax.value_and_grad(expo, argnums=1)(x, 2.0)
    np.testing.assert_allclose(dr, 2 * 0.5 - 1.5)
    # invalid parameter: the where gives f a zero derivative; the rule makes it NaN
    v, (dx, dr) = jax.value_and_grad(expo, argnums=(0, 1))(x, np.array([2.0, 2.0, -1.0]))
    dx, dr = np.asarray(dx), np.asarray(dr)
    assert np.isnan(v) and np.isnan(dr[2]) and np.isnan(dx[2]) and dr[0] == 0.5 - 1.0
    # NaN data
    v, dr = jax.value_and_grad(expo, argnums=1)(np.array([1.0, NAN]), 2.0)
    assert np.isnan(v) and np.isnan(dr)


@pytest.mark.parametrize("n", [100, 5000, 20000], ids=["small", "mid", "large"])
@pytest.mark.parametrize("element", ["normal", "laplace", "cauchy"])
def test_large_n_paths_agree_with_exact(n, element, rng, tol):
    """Above fuse's size thresholds a lax.cond skips the edge rule when the value is finite.

    (normal and laplace: the "columns" layout, one conditional per argument; cauchy, a log
    per element: the "cond" layout.)

    Both branches must give the exact rule's answer: all finite, and with one off-support
    element (-inf) or one NaN.
    """
    t = tol(np.float64)
    f, elem = {"normal": (fused_normal, normal_element),
               "laplace": (fused_laplace, laplace_element),
               "cauchy": (fused_cauchy, cauchy_element)}[element]
    x = rng.normal(size=n)
    loc = rng.normal(size=n)
    scale = np.float64(1.3)
    for bad in (None, INF, NAN):
        xb = x.copy()
        if bad is not None:
            xb[n // 2] = bad
        v, (dx, dl, ds) = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(xb, loc, scale)
        dx, dl = np.asarray(dx), np.asarray(dl)
        keep = np.arange(n) != n // 2 if bad is not None else np.ones(n, bool)
        wv, (wx, wl, ws) = jax.value_and_grad(
            lambda *a: plain_sum(elem, *a), argnums=(0, 1, 2))(xb[keep], loc[keep], scale)
        if bad is None:
            assert_close(v, wv, t["value"])
        elif bad == INF:
            assert v == -INF
            assert dx[n // 2] == 0.0 and dl[n // 2] == 0.0
            assert_close(ds, ws, t["grad"], what="scalar partial skips the off-support element")
        else:
            assert np.isnan(v) and np.isnan(dl[n // 2]) and np.isnan(ds)
        assert_close(dx[keep], wx, t["grad"])
        assert_close(dl[keep], wl, t["grad"])


@pytest.mark.parametrize("mode", ["grad", "autodiff"])
def test_benchmark_modes_agree_with_the_forward_mode_rule(mode, rng, tol):
    """The benchmark's alternatives give the fused kernel's value and gradient: "grad"
    (reverse mode per element inside the rule) and "autodiff" (the autodiff[f] reference:
    no custom rule at all, its jaxpr holds no custom_vjp call)."""
    x, loc, scale = rng.normal(size=(3, 4)), rng.normal(size=4), np.float64(1.4)
    other = kernel(normal_element, mode=mode)
    a = jax.value_and_grad(fused_normal, argnums=(0, 1, 2))(x, loc, scale)
    b = jax.value_and_grad(other, argnums=(0, 1, 2))(x, loc, scale)
    for u, w in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert_close(u, w, tol(np.float64)["grad"])
    assert "custom_vjp" in str(jax.make_jaxpr(fused_normal)(x, loc, scale))
    assert ("custom_vjp" in str(jax.make_jaxpr(other)(x, loc, scale))) == (mode == "grad")


def test_cotangent_dtypes_integer_and_data_arguments(rng):
    x32 = rng.normal(size=3).astype(np.float32)
    v, (dx, dl, ds) = jax.value_and_grad(fused_normal, argnums=(0, 1, 2))(x32, 0.5, 2.0)
    assert v.dtype == dx.dtype == np.float32 and dl.shape == ds.shape == ()
    loc64 = np.zeros(3)
    v, (dx, dl) = jax.value_and_grad(fused_normal, argnums=(0, 1))(x32, loc64, np.float32(1))
    assert v.dtype == np.float64 and dx.dtype == np.float32 and dl.dtype == np.float64
    # integer k: no cotangent (float0); float k declared data: a zero cotangent
    k = np.array([0, 2, 5])
    _, vjp = jax.vjp(fused_zip, k, 1.5, 0.2)
    ck, _, _ = vjp(jnp.ones(()))
    assert ck.dtype == jax.dtypes.float0 and ck.shape == (3,)
    dk = jax.grad(fused_zip, argnums=0)(k.astype(np.float64), 1.5, 0.2)
    np.testing.assert_array_equal(dk, np.zeros(3))


@pytest.mark.parametrize("xs, ls", [((0,), ()), ((0, 3), (3,)), ((2, 0), (2, 1))])
def test_empty_inputs(xs, ls):
    x, loc = np.zeros(xs), np.zeros(ls)
    v, (dx, dl, ds) = jax.value_and_grad(fused_normal, argnums=(0, 1, 2))(x, loc, 1.0)
    assert v == 0.0 and fused_normal(x, loc, 1.0) == 0.0
    assert dx.shape == x.shape and dl.shape == loc.shape and ds.shape == ()
    np.testing.assert_array_equal(dl, np.zeros(ls))
    assert ds == 0.0


def test_trace_time_errors_name_the_argument():
    with pytest.raises(ValueError, match="`loc`"):
        fused_normal(np.zeros(3), np.zeros(4))
    with pytest.raises(ValueError, match="`scale`"):
        jax.jit(fused_normal)(np.zeros(3), 0.0, np.ones(2))
    with pytest.raises(TypeError, match="`loc`"):
        fused_normal(np.zeros(3), np.array([1 + 1j]))
    with pytest.raises(TypeError, match="`x`"):
        fused_normal("abc")
    with pytest.raises(ValueError, match="scalar"):
        fusedlp.fuse(lambda x: jnp.stack([x, x]))(np.zeros(3))
    with pytest.raises(ValueError, match="`data`"):
        fusedlp.fuse(normal_element, data=("nope",))
    with pytest.raises(TypeError, match="callable"):
        fusedlp.fuse(3)
    with pytest.raises(TypeError, match="floating scalar"):
        fusedlp.fuse(lambda x, loc: (x > loc).astype(jnp.int32))(np.zeros(3), 0.1)
    for position in (-1, 3):  # normal_element has positions 0 .. 2
        with pytest.raises(ValueError, match=f"`data` holds position {position}"):
            fusedlp.fuse(normal_element, data=(position,))
    # one name given as a string is that name, not its characters
    by_name = fusedlp.fuse(normal_element, data="loc")
    assert jax.grad(by_name, argnums=1)(np.ones(3), 0.5) == 0.0


def test_third_derivatives_forward_over_the_hessian(rng):
    """jax.jacfwd of fusedlp.hessian (forward over the kernel's second-order rule) gives
    the third derivatives of the plain formula (a fused normal; the Student t, checked by
    hand, matched to 1e-15 but compiles for 10 s); a third reverse pass is not supported
    (docstring)."""
    p = jnp.array([0.1, 2.0])
    for n in (3, 3000):  # within one block, and across two
        x = jnp.asarray(rng.normal(size=n))
        got = jax.jacfwd(fusedlp.hessian(lambda p: fused_normal(x, p[0], p[1])))(p)
        want = jax.jacfwd(jax.hessian(
            lambda p: jnp.sum(jax.scipy.stats.norm.logpdf(x, p[0], p[1]))))(p)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())


def test_table_lookup_under_forward_mode_with_only_tangents_batched():
    """The count tables' lookup (a custom_vmap) when jacfwd batches the table's tangents
    and nothing else: its batching rule recursed without end (not reached by a kernel
    today, whose tables are constants)."""
    from fusedlp import _special

    table, idx = jnp.arange(5.0), jnp.array([1, 3, 3])
    got = jax.jacfwd(lambda t: _special.lookup(t * table, idx))(2.0)
    np.testing.assert_array_equal(got, [1.0, 3.0, 3.0])


@pytest.mark.parametrize("n", [12, 20000], ids=["exact-path", "cond-path"])
def test_undifferentiated_arguments_cost_nothing(n):
    """symbolic_zeros: differentiating fewer arguments traces fewer partials (jvps)."""
    args = (np.ones(n), np.zeros(n), np.float64(2.0))
    every = grad_primitive_counts(fused_laplace, (0, 1, 2), args)
    for subset in [(0,), (1,), (2,), (1, 2)]:
        some = grad_primitive_counts(fused_laplace, subset, args)
        assert sum(some.values()) < sum(every.values()), subset
        assert some["reduce_sum"] <= every["reduce_sum"], subset


def test_vmap_jit_and_no_retracing(rng, tol, empty_dispatch_cache):
    t = tol(np.float64)
    x = rng.normal(size=(2, 3000))  # over fuse's cond threshold: vmap batches the predicate
    x[1, 5] = INF
    loc = rng.normal(size=(2, 3000))
    vals = jax.vmap(fused_laplace, in_axes=(0, 0, None))(x, loc, 1.5)
    grads = jax.vmap(jax.grad(fused_laplace, argnums=(1, 2)), in_axes=(0, 0, None))(x, loc, 1.5)
    for b in range(2):
        assert_close(vals[b], fused_laplace(x[b], loc[b], 1.5), t["value"])
        g = jax.grad(fused_laplace, argnums=(1, 2))(x[b], loc[b], 1.5)
        assert_close(grads[0][b], g[0], t["grad"])
        assert_close(grads[1][b], g[1], t["grad"])
    assert vals[1] == -INF and grads[0][1, 5] == 0.0
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def vg(x, loc):
        return jax.value_and_grad(fused_laplace, argnums=(1, 2))(x, loc, 1.5)

    for _ in range(3):
        vg(x[0], loc[0])
        vg(x[0] + 1.0, loc[1])
    assert vg._cache_size() == 1


def test_arithmetic_heuristic():
    """The size threshold: plain arithmetic f gets the direct exact pass up to a larger N."""
    scal = [jax.ShapeDtypeStruct((), np.float64)] * 3
    j = jax.make_jaxpr(normal_element)(*scal).jaxpr
    assert _arithmetic_only(j, [True, True, False])  # log(scale) of a scalar scale
    assert not _arithmetic_only(j, [True, True, True])  # a log per element


def test_layouts():
    """The forward rule's layout follows what f does per element (see fusedlp._fuse)."""
    def layout(element, batched):
        flat = [jnp.zeros(3 if b else ()) for b in batched]
        return _layout(_Spec(element, (False,) * len(batched), "jvp"), flat, batched)[0]

    assert layout(normal_element, [True, True, False]) == "columns"
    assert layout(laplace_element, [True, True, False]) == "columns"
    assert layout(normal_element, [True, True, True]) == "cond"  # log(scale) per element
    assert layout(cauchy_element, [True, True, False]) == "cond"
    assert layout(zip_element, [True, False, False]) == "exact"  # its own where
    # its own where: the large-df and small-z^2/df forms (fusedlp.student_t)
    assert layout(fusedlp.student_t._student_t_element, [True, False, True, False]) == "exact"
    assert layout(fusedlp.gamma._gamma_element, [True, False, True]) == "exact"


def _blocks_case(name, rng, n):
    """A fast-form kernel's element function and arguments with edge elements that only the
    exact pass handles (finite there): the gamma at x = 0, shape = 1; the negative binomial
    at k = 0, mean = 0."""
    from fusedlp import gamma, negative_binomial

    if name == "gamma":
        x, shape = rng.gamma(2.0, 1.0, n), rng.uniform(0.5, 3.0, n)
        x[[0, n - 1]], shape[[0, n - 1]] = 0.0, 1.0
        return gamma._gamma_element, (x, shape, rng.uniform(0.5, 2.0, n)), (False,) * 3
    k, mean = rng.poisson(3.0, n).astype(np.float64), rng.uniform(0.5, 5.0, n)
    k[[0, 7]], mean[[0, 7]] = 0.0, 0.0
    return (negative_binomial._negative_binomial_element, (k, mean, rng.uniform(0.5, 3.0, n)),
            (True, False, False))


@pytest.mark.parametrize("name", ["gamma", "negative_binomial"])
@pytest.mark.parametrize("perturbed", [None, "vector", "scalar"])
def test_exact_pass_in_blocks_equals_the_whole(name, perturbed, rng, xla_setting):
    """fusedlp._xla.blockwise, as the fast forms' exact pass uses it: the value and the
    partials (per element for a vector argument, summed for a scalar one) over blocks of
    1000 elements and a tail are those of the whole, at the edges too."""
    from fusedlp import _fuse

    element, args, nondiff = _blocks_case(name, rng, 4099)
    args = [jnp.asarray(a) for a in args]
    if perturbed == "scalar":
        args[2] = args[2][:1].reshape(())
    spec = _Spec(element, nondiff, "jvp")
    pert = None if perturbed is None else [not nd for nd in nondiff]

    def run():
        return jax.jit(functools.partial(_fuse._exact_blocks, spec, pert))(*args)

    whole = run()  # 4099 elements: fewer than two blocks of the default size
    xla_setting("BLOCK", 1000)
    blocks = run()
    assert np.isfinite(float(jax.tree.leaves(whole)[0]))
    # a sum over blocks is rounded in another order: a few ulps of its terms (all O(1))
    chex.assert_trees_all_close(blocks, whole, rtol=1e-13, atol=1e-11)
