"""What the kernels' layouts promise about their compiled programs, asserted on the
optimised HLO (deterministic: no timing). These keep the speed after a change of spelling
or a jax upgrade; see fusedlp._xla for why each promise matters on XLA:CPU.

* The select-free forms (fusedlp._xla) hold no per-element select, clamp or gather: XLA:CPU
  reduces such an expression in one vectorised pass, but runs a select-laden one element by
  element and writes a clamp or a gather out as an array first.
* The normal kernel's value-and-gradient with a vector ``loc`` and a scalar ``scale`` writes
  one N-sized array, the gradient: the value's ``x + (-loc)`` and the partial's ``x - loc``
  are spelled apart so that XLA does not share (and write out) one array for both.
* With scalar ``loc`` and ``scale`` its value, gradient and Hessian write no N-sized array:
  every partial is a reduction, and the second partials are arithmetic on those sums.

These layouts are XLA:CPU's, and so are the optimised programs asserted on: off the CPU
(fusedlp._xla.LAYOUT) a kernel is its exact pass alone, one fusion with no lax.cond and no
loop over blocks, which the last tests here assert on every backend.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedlp
from fusedlp import _special, binomial, gamma, negative_binomial, poisson, student_t

N = 4099  # a size no other array in these programs has

# the XLA:CPU layouts, asserted on XLA:CPU's optimised programs
on_cpu = pytest.mark.skipif(jax.default_backend() != "cpu",
                            reason="asserts XLA:CPU's layouts and programs; other backends "
                                   "use the plain layout (test_plain_layout_*)")


def _optimised_hlo(fn, *args) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


# 8 exact-pass blocks (fusedlp._xla.BLOCK) and a remainder
BLOCKS_N = 8 * 65536 + 3


def _per_element_ops(hlo: str, ops=("select", "clamp", "gather")) -> list[str]:
    """Instructions of ``hlo`` that apply one of ``ops`` to N-element arrays."""
    pattern = re.compile(rf"=\s*\w+\[{N}\][^=]*?\s({'|'.join(ops)})\(")
    return [line.strip()[:120] for line in hlo.splitlines() if pattern.search(line)]


def _data(rng):
    k = rng.poisson(3.0, N).astype(np.float64)
    return {"k": k, "n": k + rng.integers(0, 5, N), "x": rng.gamma(2.0, 1.0, N) + 0.1}


def _fast_sums(rng):
    """name -> (f(param), param): the sum of a kernel's select-free form and its gradient."""
    d = _data(rng)

    def vsum(el, *args):
        args = [jnp.asarray(a, jnp.float64) for a in args]
        axes = tuple(0 if np.ndim(a) else None for a in args)
        return jnp.sum(jax.vmap(el, in_axes=axes)(*args))

    return {
        "bd0": (lambda m: jnp.sum(_special.bd0_fast(d["x"], m)), np.float64(2.0)),
        "stirlerr_int": (lambda m: jnp.sum(m * _special.stirlerr_int_fast(d["k"] + 1.0)),
                         np.float64(1.0)),
        "poisson": (lambda r: poisson._fast(True, False, d["k"], r, False, True)[0],
                    np.float64(2.5)),
        "poisson_log": (lambda e: poisson._fast(True, False, d["k"], e, True, True)[0],
                        np.float64(0.5)),
        "gamma": (lambda b: vsum(gamma._gamma_fast, d["x"], 2.5, b), np.float64(1.5)),
        "student_t": (lambda s: vsum(student_t._student_t_fast, d["x"], 5.0, 0.3, s),
                      np.float64(1.3)),
        "negative_binomial": (lambda m: vsum(negative_binomial._negative_binomial_fast,
                                             d["k"], m, 2.5), np.float64(3.0)),
        "binomial_logit": (lambda e: vsum(binomial._binomial_logit_fast, d["k"], d["n"], e),
                           np.float64(0.2)),
    }


@pytest.mark.parametrize("name", ["bd0", "stirlerr_int", "poisson", "poisson_log", "gamma",
                                  "student_t", "negative_binomial", "binomial_logit"])
@on_cpu
@pytest.mark.parametrize("order", ["value", "value_and_grad"])
def test_fast_forms_hold_no_per_element_select(name, order, rng):
    f, p = _fast_sums(rng)[name]
    fn = f if order == "value" else jax.value_and_grad(f)
    found = _per_element_ops(_optimised_hlo(fn, p))
    assert not found, f"{name} {order}: per-element select/clamp/gather:\n" + "\n".join(found)


@on_cpu
def test_the_check_sees_a_per_element_select(rng):
    """The HLO check above can fail: a jnp.where over the elements is found."""
    x = _data(rng)["x"]
    assert _per_element_ops(_optimised_hlo(lambda m: jnp.sum(jnp.where(x > m, x, m)), 1.0))


def _arrays_written(fn, *args, n: int | str) -> int:
    """How many loops of the optimised program write an n-element array (fusions and
    library calls whose result holds one): each is a pass that writes n elements. ``n`` may
    be a shape, "10,10000" (a batch of 10 arrays of 10,000)."""
    hlo = _optimised_hlo(fn, *args)
    pattern = re.compile(rf"=\s*\(?[^=]*\[{n}\][^=]*\s(fusion|custom-call)\(")
    return sum(1 for line in hlo.splitlines() if pattern.search(line))


@on_cpu
def test_normal_value_and_gradient_writes_only_the_gradient(rng):
    """Vector loc, scalar scale, N above the normal kernel's small-size threshold, data as
    jit arguments: the one N-sized array written is the gradient. Spelling the value's
    x + (-loc) as x - loc (shared with the partial's) makes XLA write (x - loc) out first."""
    n = 100_003
    fn = jax.value_and_grad(lambda loc, x: fusedlp.normal_lpdf(x, loc, 1.3))
    assert _arrays_written(fn, np.zeros(n), rng.normal(size=n), n=n) == 1


@on_cpu
def test_vmapped_normal_writes_only_the_gradient(rng):
    """The same as a vmapped batch of 10 problems: the lax.cond behind the value's
    select-free sum is on the whole batch's verdict (fusedlp._xla.batch_all), so it stays a
    cond. On each member's verdict it became a select of both branches: the batch wrote a
    second N-sized array and summed z^2 twice."""
    n = 100_000
    fn = jax.vmap(jax.value_and_grad(lambda loc, x: fusedlp.normal_lpdf(x, loc, 1.3)))
    args = (np.zeros((10, n // 10)), rng.normal(size=(10, n // 10)))
    assert _arrays_written(fn, *args, n="10,10000") == 1  # the gradient
    assert _temporaries(fn, *args, n=n) < 0.5


@on_cpu
def test_the_count_sees_a_shared_array(rng):
    """The count above can fail: an array shared by a reduction and an output is written."""
    n = 100_003

    def f(a):
        e = jnp.exp(a)
        return jnp.sum(jnp.log1p(e)), e * 2.0

    assert _arrays_written(f, rng.normal(size=n), n=n) >= 1


@on_cpu
@pytest.mark.parametrize("argnums", [(1,), (2,), (1, 2)])
def test_normal_with_scalar_parameters_writes_no_array(argnums, rng):
    """Scalar loc and scale: every partial is a reduction, so no N-sized array at all. The
    exact pass behind the select-free sums (taken only when some x is infinite) runs over
    blocks: whole, its selects were two N-sized arrays."""
    fn = jax.value_and_grad(fusedlp.normal_lpdf, argnums=argnums)
    args = (rng.normal(size=BLOCKS_N), np.float64(0.1), np.float64(1.3))
    assert _arrays_written(fn, *args, n=BLOCKS_N) == 0


@on_cpu
@pytest.mark.parametrize("wrt", ["loc_and_scale", "scale"])
def test_normal_hessian_in_scalar_parameters_writes_no_array(wrt, rng):
    """fusedlp.hessian in scalar parameters: the second partials are arithmetic on the sums
    n, sum z and sum z^2 (the JVP of normal._in_support_sums), so no N-sized array.
    Differentiating the passes themselves wrote about six (their linearisation)."""
    f = {"loc_and_scale": lambda t, x: fusedlp.normal_lpdf(x, t[0], t[1]),
         "scale": lambda t, x: fusedlp.normal_lpdf(x, 0.1, t[1])}[wrt]
    fn = fusedlp.hessian(f)
    assert _arrays_written(fn, np.array([0.1, 1.3]), rng.normal(size=BLOCKS_N),
                           n=BLOCKS_N) == 0


def _temporaries(fn, *args, n: int) -> float:
    """XLA's temporaries of the compiled ``fn``, in N-sized float64 arrays."""
    mem = jax.jit(fn).lower(*args).compile().memory_analysis()
    return mem.temp_size_in_bytes / (8.0 * n)


def _vector_parameter_kernels(rng, n):
    d = {k: np.resize(v, n) for k, v in _data(rng).items()}
    return {
        "gamma": lambda b: fusedlp.gamma_lpdf(d["x"], 2.5, b),
        "student_t": lambda m: fusedlp.student_t_lpdf(d["x"], 5.0, m, 1.3),
        "negative_binomial": lambda m: fusedlp.negative_binomial_lpmf(d["k"], m, 2.5),
        "binomial_logit": lambda e: fusedlp.binomial_logit_lpmf(d["k"], d["n"], e),
        "poisson": lambda r: fusedlp.poisson_lpmf(d["k"], r),
        "poisson_log": lambda e: fusedlp.poisson_log_lpmf(d["k"], e),
    }


@pytest.mark.parametrize("name", ["gamma", "student_t", "negative_binomial", "binomial_logit",
                                  "poisson", "poisson_log"])
@on_cpu
def test_fast_form_kernels_keep_temporaries_block_sized(name, rng):
    """Value and gradient in a vector parameter at N = 8 blocks: the exact pass behind the
    fast form runs over blocks (fusedlp._xla.blockwise), as do the long values of the
    negative binomial and the binomial, so the program's temporaries stay under 4.5 N-sized
    arrays (whole, the exact pass's selects made 12 for the gamma, 25 for the negative
    binomial, 22 for the binomial; the Poisson kernels' 4 and 5 are now about 1)."""
    fn = jax.value_and_grad(_vector_parameter_kernels(rng, BLOCKS_N)[name])
    assert _temporaries(fn, np.full(BLOCKS_N, 1.5), n=BLOCKS_N) < 4.5


@pytest.mark.parametrize("name, bound", [("gamma", 1.2), ("student_t", 0.5),
                                         ("negative_binomial", 3.5), ("binomial_logit", 3.0)])
@on_cpu
def test_fast_partials_pass_the_fallback_in_place(name, bound, rng):
    """The gradient alone in a vector parameter at N = 8 blocks: the fast pass's per-element
    partials go on through the fallback to the exact pass (fusedlp._xla.fast_or_exact)
    without a copy, since that is a loop of at most one trip, whose carry XLA passes through
    in place. A lax.cond's branch that returned them copied them: one N-sized temporary
    more (1.77, 1.13, 3.52 and 3.53 arrays, against 0.77, 0.13, 2.52 and 2.53). The
    negative binomial's is 3.39 since its exact pass selects bd0's arguments where
    p = phi/(phi + mu) underflows: block-sized arrays of the exact pass, not a copy."""
    fn = jax.grad(_vector_parameter_kernels(rng, BLOCKS_N)[name])
    assert _temporaries(fn, np.full(BLOCKS_N, 1.5), n=BLOCKS_N) < bound


@on_cpu
@pytest.mark.parametrize("counts", [np.int32, np.float64])
@pytest.mark.parametrize("name", ["poisson", "poisson_log"])
def test_poisson_fast_value_is_summed_over_blocks(name, counts, rng):
    """Counts as a jit argument (the kernels' own benchmark context), value and gradient in
    a vector parameter at N = 8 blocks: Loader's form in the fast pass is written and
    summed over blocks, so the program's temporaries stay under 3 N-sized arrays (1.6 and
    2.5 measured with int32 counts). Whole, they were 4 with float counts and 5 with
    integer ones (their float copy), which at N = 10^6 passes glibc's 32 MiB mmap ceiling:
    every call then faulted in fresh pages (15-18 ms against 6-9 ms in blocks)."""
    kernel = {"poisson": lambda p, k: fusedlp.poisson_lpmf(k, jnp.exp(p)),
              "poisson_log": lambda p, k: fusedlp.poisson_log_lpmf(k, p)}[name]
    k = rng.poisson(3.0, BLOCKS_N).astype(counts)
    fn = jax.value_and_grad(kernel)
    assert _temporaries(fn, np.full(BLOCKS_N, 0.5), k, n=BLOCKS_N) < 3.0


@on_cpu
def test_the_temporaries_check_sees_a_whole_exact_pass(rng, xla_setting):
    """The bound above can fail: with blocks larger than N, the exact pass is whole."""
    xla_setting("BLOCK", 2**30)
    fn = jax.value_and_grad(_vector_parameter_kernels(rng, BLOCKS_N)["negative_binomial"])
    assert _temporaries(fn, np.full(BLOCKS_N, 1.5), n=BLOCKS_N) > 4.5


@pytest.mark.parametrize("members", [512, 65536], ids=["1024x512", "8x65536"])
@pytest.mark.parametrize("name", ["gamma", "student_t", "negative_binomial", "binomial_logit",
                                  "poisson", "poisson_log"])
@on_cpu
def test_vmapped_batch_of_small_problems_keeps_the_large_layout(name, members, rng):
    """The 8 blocks of elements above as a vmapped batch of problems, each too small for
    the fast form (512 elements) or for blocks of its own (65536): the batch as a whole is
    large, so the fast form runs (fusedlp._xla.fast_or_exact's batching rule) and the exact
    pass behind it goes over blocks of members (fusedlp._xla.blockwise's), within the same
    4.5 N-sized temporaries (1.3 to 4 measured). Member by member, as before these rules,
    the batch held the whole exact pass's: 5 to 6 N for the Poisson kernels, 11 to 12 for
    the gamma, 19 to 20 for the binomial, 23 to 24 for the negative binomial."""
    total = 8 * 65536
    d = {key: np.resize(v, total).reshape(-1, members) for key, v in _data(rng).items()}
    kernel = {
        "gamma": lambda b, d: fusedlp.gamma_lpdf(d["x"], 2.5, b),
        "student_t": lambda m, d: fusedlp.student_t_lpdf(d["x"], 5.0, m, 1.3),
        "negative_binomial": lambda m, d: fusedlp.negative_binomial_lpmf(d["k"], m, 2.5),
        "binomial_logit": lambda e, d: fusedlp.binomial_logit_lpmf(d["k"], d["n"], e),
        "poisson": lambda r, d: fusedlp.poisson_lpmf(d["k"], r),
        "poisson_log": lambda e, d: fusedlp.poisson_log_lpmf(d["k"], e),
    }[name]
    fn = jax.vmap(jax.value_and_grad(kernel))
    assert _temporaries(fn, np.full((total // members, members), 1.5), d, n=total) < 4.5


_KERNELS_OF_DATA = {
    "gamma": lambda b, k: fusedlp.gamma_lpdf(k + 0.5, 2.5, b),
    "student_t": lambda m, k: fusedlp.student_t_lpdf(k, 5.0, m, 1.3),
    "negative_binomial": lambda m, k: fusedlp.negative_binomial_lpmf(k, m, 2.5),
    "binomial_logit": lambda e, k: fusedlp.binomial_logit_lpmf(k, k + 2.0, e),
    "poisson": lambda r, k: fusedlp.poisson_lpmf(k, r),
    "poisson_log": lambda e, k: fusedlp.poisson_log_lpmf(k, e),
}


@pytest.mark.parametrize("name, bound", [
    ("gamma", 4.5), ("student_t", 1.75), ("negative_binomial", 15.0),
    ("binomial_logit", 13.0), ("poisson", 4.0), ("poisson_log", 4.5)])
@on_cpu
def test_exact_pass_of_one_to_two_blocks_runs_in_halves(name, bound, rng):
    """Value and gradient in a vector parameter, counts as a jit argument, at N = 100,000
    (between one and two blocks): the exact pass behind the fast form runs over two blocks
    of 50,000 (fusedlp._xla.blockwise's ``fallback``), under ``bound`` N-sized temporaries
    (4.06, 1.5, 13.56, 11.63, 3.56, 4.06 measured); so does a vmapped batch of 10 problems
    of 10,000, in two blocks of 5 members. At N = 100,003, which no block size between half
    a block and a block divides, it stays whole (a remainder block would be a second copy
    of it to compile) and holds more than the bound (6.13, 2.0, 26.13, 21.25, 5.13, 6.13),
    as does a batch of 11 problems of 9,091 (7 members fill a block; 11 is prime)."""
    one = jax.value_and_grad(_KERNELS_OF_DATA[name])

    def temps(shape):
        fn = one if len(shape) == 1 else jax.vmap(one)
        k = rng.poisson(3.0, shape).astype(np.float64)
        return _temporaries(fn, np.full(shape, 1.5), k, n=math.prod(shape))

    assert max(temps((100_000,)), temps((10, 10_000))) < bound
    assert min(temps((100_003,)), temps((11, 9_091))) > bound


def _program_lines(fn, shape) -> int:
    """Lines of the lowered ``jit(fn)`` for a parameter and counts of ``shape``: how much
    code XLA compiles (the exact passes are its largest part)."""
    return len(jax.jit(fn).lower(np.full(shape, 1.5), np.ones(shape)).as_text().splitlines())


@on_cpu
@pytest.mark.parametrize("name", list(_KERNELS_OF_DATA))
def test_exact_pass_in_blocks_is_one_copy_in_the_program(name, xla_setting):
    """fusedlp._xla.blockwise leaves no remainder block, whose pass of another shape would
    be a second copy of the exact pass to compile (a vmapped Poisson GLM fit spent a third
    of its compile time there). With blocks of 1000 elements (25 members of 40): a batch of
    64 members ends in a block that overlaps the one before, and its program is that of 75
    (three whole blocks); a problem of 3100 elements goes in four blocks of 775, and its
    program is that of 3000. Of 3001 (a prime), the remainder's copy shows."""
    xla_setting("BLOCK", 1000)
    batch = jax.vmap(jax.value_and_grad(_KERNELS_OF_DATA[name]))
    assert _program_lines(batch, (64, 40)) == _program_lines(batch, (75, 40))
    one = jax.value_and_grad(_KERNELS_OF_DATA[name])
    whole = _program_lines(one, (3000,))
    assert _program_lines(one, (3100,)) == whole
    assert _program_lines(one, (3001,)) > 1.2 * whole


@on_cpu
@pytest.mark.parametrize("name", ["poisson_log", "negative_binomial", "gamma"])
def test_nested_vmap_keeps_one_verdict_for_the_whole_batch(name, rng):
    """Under a vmap of vmaps the fast form's verdict is still one for the whole batch
    (fusedlp._xla.batch_all reduces at every level), so its lax.cond stays a cond: a
    batched predicate would make it a select that runs the exact pass too, every call."""
    kernel = _KERNELS_OF_DATA[name]
    k = rng.poisson(3.0, (4, 128, 40)).astype(np.float64)
    p = np.full(k.shape, 1.5)
    flat = str(jax.make_jaxpr(jax.vmap(jax.value_and_grad(kernel)))(p.reshape(512, 40),
                                                                     k.reshape(512, 40)))
    nested = str(jax.make_jaxpr(jax.vmap(jax.vmap(jax.value_and_grad(kernel))))(p, k))
    assert flat.count("cond[") > 0
    assert nested.count("cond[") == flat.count("cond[")


# fuse's second-order rule (fusedlp._fuse._second_order_jvp) forms each element's second
# partials once, behind a fence (fusedlp._xla.fenced); an outer jacrev then multiplies them
# by each basis vector. Without the fence XLA fuses the whole chain of f into that product
# and forms it once per basis vector.
P = 7  # basis vectors of the outer jacrev: a size no other array dimension has


@fusedlp.fuse
def _user_t(x, df):
    """A user's own density with no hand partial: its Hessian runs f forward over forward."""
    return (jax.scipy.special.gammaln(0.5 * (df + 1.0)) - jax.scipy.special.gammaln(0.5 * df)
            - 0.5 * jnp.log(df) - 0.5 * (df + 1.0) * jnp.log1p(x * x / df))


def _glm_hessian(name, rng):
    """A fuse-built kernel's Hessian in a regression's P coefficients, as fit's Newton steps
    form it: reverse over reverse, the outer jacrev vmapped over P basis vectors."""
    d = _data(rng)
    X = rng.normal(size=(N, P)) * 0.1
    kernels = {
        "negative_binomial": lambda e: fusedlp.negative_binomial_lpmf(d["k"], jnp.exp(e), 2.5),
        "gamma": lambda e: fusedlp.gamma_lpdf(d["x"], 2.5, jnp.exp(e)),
        "gamma_shape": lambda e: fusedlp.gamma_lpdf(d["x"], jnp.exp(e), 2.5),
        "student_t_df": lambda e: fusedlp.student_t_lpdf(d["x"], jnp.exp(e), 0.0, 1.3),
        "user_t_df": lambda e: _user_t(d["x"], jnp.exp(e)),
        "student_t": lambda e: fusedlp.student_t_lpdf(d["x"], 5.0, e, 1.3),
        "binomial_logit": lambda e: fusedlp.binomial_logit_lpmf(d["k"], d["n"], e),
        "bernoulli_logit": lambda e: fusedlp.bernoulli_logit_lpmf((d["k"] > 2) * 1.0, e),
    }
    return fusedlp.hessian(lambda b: kernels[name](X @ b)), np.zeros(P)


def _ops_per_basis_vector(hlo: str) -> int:
    """The most instructions in one fused computation whose result holds a [P, N] array:
    the work XLA does per basis vector and element."""
    bodies = dict(re.findall(r"\n(%[\w.\-]+) \([^\n]*\{\n(.*?)\n\}", hlo, re.S))
    most = 0
    for line in hlo.splitlines():
        m = re.search(rf"=\s*\(?[^=]*\[{P},{N}\][^=]*\sfusion\(.*calls=(%[\w.\-]+)", line)
        if m:
            most = max(most, len(bodies.get(m.group(1), "").splitlines()))
    return most


@pytest.mark.parametrize("name", ["negative_binomial", "gamma", "gamma_shape", "student_t",
                                  "student_t_df", "user_t_df", "binomial_logit",
                                  "bernoulli_logit"])
@on_cpu
def test_fused_hessian_forms_second_partials_once(name, rng):
    """Per basis vector and element, a few products (the chain of f holds hundreds)."""
    assert _ops_per_basis_vector(_optimised_hlo(*_glm_hessian(name, rng))) < 40


def _transcendentals(fn, *args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    return (cost[0] if isinstance(cost, list) else cost)["transcendentals"]


@on_cpu
def test_binomial_hessian_drops_the_value(rng):
    """fit's Newton steps use the gradient and Hessian alone. The binomial's second-order
    rule judges its hand pieces by a verdict on k, n and the logit (kernel's
    ``hand_verdict``), not by the value, and forms the value apart, where XLA drops it:
    its Hessian program holds fewer transcendental operations (XLA's cost analysis) than
    the same kernel built without the verdict, by at least 4 per element (the fast value's
    logs and exps; 10 against 16 per element when written)."""
    from fusedlp._fuse import kernel

    without = kernel(binomial._binomial_logit_element, **binomial._BINOMIAL_LOGIT_OPTIONS)
    d = _data(rng)
    X = rng.normal(size=(N, P)) * 0.1

    def hessian(kern):
        return fusedlp.hessian(lambda b: kern(d["k"], d["n"], X @ b))

    b = np.zeros(P)
    with_verdict = _transcendentals(hessian(binomial._binomial_logit), b)
    assert with_verdict + 4 * N <= _transcendentals(hessian(without), b)


def _with_and_without_verdict(name, rng):
    """``(kernel, the same kernel built without its hand_verdict, its log-density of one
    vector parameter)`` for the kernels that judge their partials by a verdict."""
    from fusedlp import gamma, negative_binomial
    from fusedlp._fuse import kernel

    d = _data(rng)
    if name == "binomial_logit":
        return (binomial._binomial_logit,
                kernel(binomial._binomial_logit_element, **binomial._BINOMIAL_LOGIT_OPTIONS),
                lambda kern, e: kern(d["k"], d["n"], e))
    if name == "negative_binomial":
        nb = negative_binomial
        return (nb._negative_binomial,
                kernel(nb._negative_binomial_element, **nb._nb_options(
                    nb._negative_binomial_fast, nb._negative_binomial_dconc)),
                lambda kern, mu: kern(d["k"], mu, 3.0))
    if name == "student_t":
        return (student_t._student_t,
                kernel(student_t._student_t_element, **student_t._T_OPTIONS),
                lambda kern, loc: kern(d["x"], 5.0, loc, 1.3))
    return (gamma._gamma, kernel(gamma._gamma_element, **gamma._GAMMA_OPTIONS),
            lambda kern, rate: kern(d["x"], 2.5, rate))


@on_cpu
@pytest.mark.parametrize("name, scalar, fewer", [
    ("binomial_logit", False, 2), ("binomial_logit", True, 2), ("negative_binomial", False, 2),
    ("gamma", False, 2), ("student_t", False, 1)])
def test_gradient_alone_drops_the_value(name, scalar, fewer, rng):
    """The same verdict judges the first-order rule's hand partials, and the value is formed
    apart: ``jax.grad`` alone (an optax step, a user's own loop) does not form the value,
    so its program holds fewer transcendental operations than the same kernel's without
    the verdict, by at least ``fewer`` per element (the binomial: 9 against 15 per element
    in a vector logit, 4 against 6 in a scalar one; the Student t, whose value has one
    log1p per element: 2 against 3; loops' bodies counted once)."""
    with_verdict, without, lpdf = _with_and_without_verdict(name, rng)
    param = np.float64(0.2) if scalar else rng.uniform(0.5, 2.0, N)

    def grad(kern):
        return jax.grad(lambda p: lpdf(kern, p))

    assert _transcendentals(grad(with_verdict), param) + fewer * N <= (
        _transcendentals(grad(without), param))


@on_cpu
def test_bernoulli_gradient_alone_forms_no_log1p(rng):
    """The Bernoulli's edge function (kernel's ``edge``) marks its edges without its value,
    so ``jax.grad`` alone in a vector logit drops the value's log1p: one transcendental per
    element (the exp of the sigmoid) against two in value and gradient. With the edge rule
    reading the value, both held two."""
    y = (rng.uniform(size=N) < 0.5).astype(np.int32)
    eta = rng.normal(size=N)

    def f(e):
        return fusedlp.bernoulli_logit_lpmf(y, e)

    assert _transcendentals(jax.grad(f), eta) < 1.5 * N
    assert _transcendentals(jax.value_and_grad(f), eta) >= 2 * N


_SCALAR_PAIRS = {  # two scalar parameters with hand partials, and the data
    "student_t": (lambda t, x: fusedlp.student_t_lpdf(x, 5.0, t[0], t[1]), "x", [0.1, 1.3]),
    "student_t_df": (lambda t, x: fusedlp.student_t_lpdf(x, t[0], t[1], t[2]), "x",
                     [5.0, 0.1, 1.3]),
    "gamma": (lambda t, x: fusedlp.gamma_lpdf(x, t[0], t[1]), "x", [2.5, 1.5]),
    "negative_binomial": (lambda t, k: fusedlp.negative_binomial_lpmf(k, t[0], t[1]), "k",
                          [4.0, 3.0]),
}


@on_cpu
@pytest.mark.parametrize("name, value", [("student_t", True), ("student_t", False),
                                         ("student_t_df", True), ("student_t_df", False),
                                         ("gamma", False), ("negative_binomial", False)])
def test_scalar_hand_partials_write_no_array(name, value, rng):
    """Two or three scalar parameters, data as jit arguments: each partial is a reduction, and the
    hand partials are formed over blocks (fusedlp._fuse._hand_partials), so they write no
    N-sized array. Whole, what the two reductions share (z, the verdict, a broadcast
    parameter) was written out: five N-sized arrays for the Student t, 28 for the negative
    binomial. (The gamma's value pass, beside them in value_and_grad, still writes its
    own.)"""
    f, data, t = _SCALAR_PAIRS[name]
    fn = (jax.value_and_grad if value else jax.grad)(f)
    x = np.resize(_data(rng)[data], BLOCKS_N)
    assert _arrays_written(fn, np.array(t), x, n=BLOCKS_N) == 0


@on_cpu
@pytest.mark.parametrize("name", sorted(_SCALAR_PAIRS))
def test_scalar_hessian_writes_no_array(name, rng):
    """fusedlp.hessian in scalar parameters: each second partial is a reduction, and the rows
    are formed over blocks (fusedlp._fuse._second_order_jvp), so they write no N-sized array.
    Whole, each per-element row and second partial was written out, then summed."""
    f, data, t = _SCALAR_PAIRS[name]
    x = np.resize(_data(rng)[data], BLOCKS_N)
    assert _arrays_written(fusedlp.hessian(f), np.array(t), x, n=BLOCKS_N) == 0


@on_cpu
def test_the_basis_vector_count_sees_an_unfenced_chain(rng, xla_setting):
    """The bound above can fail: without the fence, f's chain is formed per basis vector (a
    user's density with no hand partial: its Hessian runs f forward over forward, where the
    built-in kernels differentiate their hand partials)."""
    xla_setting("fenced", lambda fn, shapes, *arrays: fn(*arrays))
    assert _ops_per_basis_vector(_optimised_hlo(*_glm_hessian("user_t_df", rng))) > 40


_PLAIN_KERNELS = {"normal": lambda m, k: fusedlp.normal_lpdf(k, m, 1.3), **_KERNELS_OF_DATA}


@pytest.fixture
def layout():
    """``layout(name)`` sets fusedlp._xla.LAYOUT; jax's caches are cleared with each change
    (the kernels' inner jitted pieces cache traces made under the layout before), and the
    backend's own layout is back after the test."""
    from fusedlp import _xla

    def use(name):
        _xla.LAYOUT = name
        jax.clear_caches()

    yield use
    use(None)


def _lowered(fn, shape):
    counts = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) % 7
    return jax.jit(fn).lower(np.full(shape, 1.5), counts).as_text()


@pytest.mark.parametrize("name", list(_PLAIN_KERNELS))
def test_plain_layout_is_the_exact_pass_alone(name, layout):
    """Off XLA:CPU a kernel's value-and-gradient is its exact pass alone: no lax.cond and
    no loop over blocks (docs/gpu.md),
    for a single problem and a vmapped batch, large enough for every XLA:CPU layout to
    show. The XLA:CPU layout of the single problem holds both: the check can fail."""
    n = 3 * 65536

    def control_flow(text):
        return [op for op in ("stablehlo.case", "stablehlo.if", "stablehlo.while")
                if op in text]

    layout("plain")
    vg = jax.value_and_grad(_PLAIN_KERNELS[name])
    assert control_flow(_lowered(vg, n)) == []
    assert control_flow(_lowered(jax.vmap(vg), (64, n // 64))) == []
    layout("cpu")
    vg = jax.value_and_grad(_PLAIN_KERNELS[name])
    assert control_flow(_lowered(vg, n)) != []


@pytest.mark.parametrize("name", list(_PLAIN_KERNELS))
def test_plain_layout_gives_the_numbers_of_the_cpu_layouts(name, layout, rng):
    """The plain layout computes the same value and gradient, and the same edge rules (a
    NaN parameter, data off the support), as the XLA:CPU layouts."""
    n = 3 * 65536
    k = rng.poisson(3.0, n).astype(np.float64)
    param = rng.uniform(0.5, 2.0, n)
    cases = {"common": (param, k), "nan parameter": (param.copy(), k),
             "negative datum": (param, k.copy()), "infinite datum": (param, k.copy())}
    cases["nan parameter"][0][5] = np.nan
    cases["negative datum"][1][7] = -1.0  # off the support but for the normal and the t
    cases["infinite datum"][1][7] = np.inf  # off every kernel's support
    got = {}
    for name_of_layout in ("plain", "cpu"):
        layout(name_of_layout)
        vg = jax.jit(jax.value_and_grad(_PLAIN_KERNELS[name]))
        got[name_of_layout] = {case: [np.asarray(a) for a in vg(*args)]
                               for case, args in cases.items()}
    for case in cases:
        for a, b in zip(got["plain"][case], got["cpu"][case]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True,
                                       err_msg=f"{name}, {case}")


def _whiles_in_entry(hlo: str) -> int:
    entry = hlo[hlo.index("\nENTRY"):]
    return len(re.findall(r"\swhile\(", entry[:entry.index("\n}")]))


@on_cpu
@pytest.mark.parametrize("name", ["negative_binomial", "binomial_logit"])
def test_data_term_is_hoisted_out_of_a_loop(name, rng):
    """Counts passed as jit arguments, value and gradient at each step of a fori_loop (as a
    fit or a sampler calls it): the fast form's data-only part (Loader's part of log k!, the
    counts' verdicts) is summed in a loop over blocks of its own, which reads the counts
    alone, so XLA hoists it out of the steps' loop: the program's entry holds two loops, the
    steps' and the data's. Formed per element inside the fast pass, it ran at every step
    (one loop in the entry)."""
    d = {k: np.resize(v, BLOCKS_N) for k, v in _data(rng).items()}
    f = {"negative_binomial": lambda m, k, n: fusedlp.negative_binomial_lpmf(k, m, 2.5),
         "binomial_logit": lambda e, k, n: fusedlp.binomial_logit_lpmf(k, n, e)}[name]
    vg = jax.value_and_grad(f)

    def steps(v, k, n):
        def body(_, carry):
            v, _ = carry
            val, g = vg(v, k, n)
            return v + 1e-9 * g, val
        return jax.lax.fori_loop(0, 5, body, (v, jnp.zeros((), v.dtype)))

    hlo = _optimised_hlo(steps, np.full(BLOCKS_N, 1.5), d["k"].astype(np.int32),
                         d["n"].astype(np.int32))
    assert _whiles_in_entry(hlo) == 2
