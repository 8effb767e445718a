"""Maximum likelihood in one compiled loop, and standard errors from the Hessian.

:func:`fit` maximises ``objective(params, *data)`` inside a single ``lax.while_loop``, with a
safeguarded Newton method (the default for up to :data:`NEWTON_MAX_PARAMS` parameters),
L-BFGS or any optax transformation: traced and compiled once per shapes, no Python per
step, and usable under ``jax.jit`` and ``jax.vmap``. :func:`standard_errors` turns the
curvature at the optimum into asymptotic standard errors; :func:`fusedlp.summary` adds the
rest of an inference table.
"""

from __future__ import annotations

import enum
import functools
import math
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.typing import ArrayLike

from fusedlp import _checks

__all__ = ("NEWTON_MAX_PARAMS", "FitResult", "FitStatus", "fit", "standard_errors")

PyTree = Any

_RUNNING = -1

#: ``fit``'s default optimizer is Newton up to this many scalar parameters and L-BFGS above:
#: a Newton step forms and decomposes a p x p Hessian (p reverse passes and O(p^3)); up to
#: here that stays close to the cost of L-BFGS's many cheaper steps on well-scaled GLMs,
#: and it converges where L-BFGS does not (badly scaled covariates). See bench/README.md.
NEWTON_MAX_PARAMS = 100

# Newton's line search halves the step at most this often (to 2^-30) before giving up.
_MAX_HALVINGS = 30
# Armijo's sufficient-decrease constant (Nocedal & Wright's usual 1e-4).
_ARMIJO = 1e-4


class FitStatus(enum.IntEnum):
    """Why a fit ended; ``FitResult.status`` holds one of these as an int32 array.

    Compare directly (``result.status == FitStatus.CONVERGED``) or name a concrete result
    with ``FitStatus(int(result.status)).name`` (``repr(result)`` does).
    """

    CONVERGED = 0  #: the convergence test holds at ``params`` (see :func:`fit`)
    MAX_STEPS = 1  #: ``max_steps`` steps taken without meeting the test
    DIVERGED = 2  #: a step gave a non-finite objective, gradient, Hessian or parameters
    STALLED = 3  #: no step can make progress (the parameters would not change)
    #: Newton: the decrement met ``tol`` only as the curvature vanished, its steps no longer
    #: shrinking: the parameters run off to infinity (perfect separation, a dispersion
    #: tending to 0 on a log scale), or the Hessian is singular (collinear covariates)
    SINGULAR = 4

    # By name, as ``repr`` does (an IntEnum would print its number).
    def __str__(self) -> str:
        return f"FitStatus.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def _status_text(status) -> str:
    s = np.asarray(status)
    if s.ndim == 0:
        return f"FitStatus.{FitStatus(int(s)).name}"
    names, counts = np.unique(s, return_counts=True)
    return "{" + ", ".join(f"{FitStatus(int(v)).name}: {int(c)}"
                           for v, c in zip(names, counts)) + "}"


class _Shown(str):
    """A string that reprs as itself (a leaf of a printed params tree)."""

    def __repr__(self) -> str:
        return str(self)


class FitResult(NamedTuple):
    """What :func:`fit` returns: a pytree, so it passes through ``jit`` and ``vmap``.

    Attributes:
      params: the parameters, shaped like ``init_params``: the last finite iterate.
      value: the objective at ``params`` (as ``objective`` returns it, never negated).
      grad_norm: the Euclidean norm of the objective's gradient at ``params``, over all
        leaves together.
      num_steps: optimizer steps that led to ``params`` (int32; a diverging step that was
        rejected is not counted).
      converged: ``status == FitStatus.CONVERGED`` (bool).
      status: a :class:`FitStatus` code (int32); ``repr`` prints its name.
      history: shape ``(max_steps + 1,)``: ``history[0]`` is the objective at
        ``init_params``, ``history[i]`` after step ``i``; ``history[num_steps] == value``
        and the entries past ``num_steps`` are NaN.
      hessian: with ``"newton"``, the objective's Hessian at ``params`` over all leaves
        flattened together (``ravel_pytree`` order, unnegated), as the loop formed it for
        its last verdict: :func:`fusedlp.summary` uses it. ``None`` for other optimizers.
    """

    params: PyTree
    value: jax.Array
    grad_norm: jax.Array
    num_steps: jax.Array
    converged: jax.Array
    status: jax.Array
    history: jax.Array
    hessian: jax.Array | None = None

    def __repr__(self) -> str:
        if not _checks.is_concrete(self):
            return "FitResult(" + ", ".join(f"{k}={v!r}" for k, v in self._asdict().items()) + ")"

        def show(x):
            a = np.asarray(x)
            return repr(a.item()) if a.ndim == 0 else repr(a)

        params = jax.tree.map(lambda x: _Shown(show(x)), self.params)
        return (f"FitResult(status={_status_text(self.status)}, "
                f"num_steps={show(self.num_steps)}, value={show(self.value)}, "
                f"grad_norm={show(self.grad_norm)}, params={params!r})")

    def to_dict(self) -> dict:
        """The result as NumPy: ``params`` (a pytree of arrays), the scalar fields as
        arrays, ``status`` as its :class:`FitStatus` name (an array of names if
        batched), ``history`` and ``hessian`` (None without one). Concrete results only."""
        if not _checks.is_concrete(self):
            raise TypeError("FitResult.to_dict: the result is traced (inside jit or vmap)")
        s = np.asarray(self.status)
        names = np.vectorize(lambda v: FitStatus(int(v)).name, otypes=[object])(s)
        return {"params": jax.tree.map(np.asarray, self.params),
                "value": np.asarray(self.value), "grad_norm": np.asarray(self.grad_norm),
                "num_steps": np.asarray(self.num_steps),
                "converged": np.asarray(self.converged),
                "status": names.item() if s.ndim == 0 else names,
                "history": np.asarray(self.history),
                "hessian": None if self.hessian is None else np.asarray(self.hessian)}

    def to_frame(self):
        """The result as a pandas DataFrame, one row per fit (a ``vmap``-ed batch of fits
        gives one row per member, indexed by its position in the batch): a column per
        scalar parameter, named as :func:`fusedlp.summary` names them (``beta[0]``), then
        ``value``, ``grad_norm``, ``num_steps``, ``converged`` and ``status`` (by name).
        ``history`` is left out (``to_dict`` has it). Concrete results only; needs pandas
        (the ``frames`` extra)."""
        from fusedlp.inference import pandas, parameter_names

        pd = pandas("FitResult.to_frame")

        d = self.to_dict()
        batch = np.shape(d["value"])
        rows = int(np.prod(batch, dtype=int))
        member = jax.tree.map(lambda a: a[(0,) * len(batch)] if batch else a, d["params"])
        cols = [np.reshape(a, (rows, -1)) for a in jax.tree.leaves(d["params"])]
        values = np.concatenate(cols, axis=1) if cols else np.zeros((rows, 0))
        names = parameter_names(member)
        own = ("value", "grad_norm", "num_steps", "converged", "status")
        clash = [n for n in names if n in own]
        if clash:
            raise ValueError(f"FitResult.to_frame: parameter column(s) {clash} would clash "
                             f"with the result's own columns {own}; rename the parameters "
                             "or use to_dict()")
        frame = pd.DataFrame(values, columns=names)
        for key in own:
            frame[key] = np.reshape(d[key], rows)
        if len(batch) > 1:
            frame.index = pd.MultiIndex.from_tuples(list(np.ndindex(*batch)))
        return frame


@functools.lru_cache(maxsize=None)
def default_optimizer() -> optax.GradientTransformationExtraArgs:
    """What ``optimizer="lbfgs"`` means: ``optax.lbfgs()``, made once.

    L-BFGS with optax's zoom line search (strong Wolfe conditions): no learning rate, one
    gradient per step, and no Hessian: :func:`fit` uses it by default above
    :data:`NEWTON_MAX_PARAMS` parameters. Its steps are not invariant to the parameters'
    scales, so it needs many more of them on badly scaled problems (GLMs with covariates of
    very different sizes) than Newton does. The line search backs off from steps that
    leave the support (a NaN or infinite objective). The same object is returned on every
    call, so that ``fit``'s compilation cache hits.
    """
    return optax.lbfgs()


def _default_tol(dtype) -> float:
    """Gradient methods: 1e-8 in float64, 1e-5 in float32, sqrt(eps) otherwise."""
    eps = float(jnp.finfo(dtype).eps)
    return 1e-8 if eps < 1e-15 else 1e-5 if eps < 1e-6 else math.sqrt(eps)


def _default_newton_tol(dtype) -> float:
    """Newton: sqrt(eps), about where rounding in the gradient hides a smaller decrement."""
    return math.sqrt(float(jnp.finfo(dtype).eps))


# ---------------------------------------------------------------------------- checks


def _as_float_params(init_params: PyTree) -> PyTree:
    """``jnp.asarray`` every leaf; integer or boolean leaves become the default float."""

    def conv(leaf):
        a = jnp.asarray(leaf)
        if jnp.issubdtype(a.dtype, jnp.inexact):
            return a
        if jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_:
            return a.astype(jnp.result_type(float))
        raise TypeError(f"fit: parameter leaves must be real arrays, got dtype {a.dtype}")

    params = jax.tree.map(conv, init_params)
    if not jax.tree.leaves(params):
        raise ValueError("fit: the parameters have no array leaves")
    return params


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


@jax.jit
def _all_finite(x: jax.Array) -> jax.Array:
    return jnp.all(jnp.isfinite(x))


def _check_concrete(name: str, tree: PyTree, *, allow_empty: bool) -> None:
    """Raise ValueError naming ``name`` + path if a concrete leaf is empty or non-finite."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if _is_tracer(leaf):
            continue
        where = name + jax.tree_util.keystr(path)
        if isinstance(leaf, jax.Array) and len(leaf.sharding.device_set) > 1:
            # Split over devices (fusedlp.shard): checked where it lies, since copying it to
            # the host would gather the data (and cannot, across processes); the copy below
            # only locates an offending entry for the message.
            if leaf.size == 0 and not allow_empty:
                raise ValueError(f"fit: {where} is empty (shape {leaf.shape})")
            if not jnp.issubdtype(leaf.dtype, jnp.inexact) or bool(_all_finite(leaf)):
                continue
            if not leaf.is_fully_addressable:
                raise ValueError(f"fit: {where} must be finite, found a NaN or infinity")
        arr = np.asarray(leaf)
        if arr.size == 0 and not allow_empty:
            raise ValueError(f"fit: {where} is empty (shape {arr.shape})")
        if np.issubdtype(arr.dtype, np.inexact):
            bad = ~np.isfinite(arr)
            if bad.any():
                idx = tuple(int(i) for i in np.argwhere(bad)[0]) if arr.ndim else ()
                at = f" at index {idx}" if idx else ""
                raise ValueError(f"fit: {where} must be finite, found {arr[idx]}{at}")


def _under_vmap(*trees: PyTree) -> bool:
    # jax has no public "am I being batched" query; a batched input is a BatchTracer.
    return any(type(leaf).__name__ == "BatchTracer" for leaf in jax.tree.leaves(trees))


# ---------------------------------------------------------------------------- progress


class _ProgressBar:
    """Host side of ``progress=True``: a tqdm bar driven by ``jax.debug.callback``.

    One instance per trace; a compiled fit can run many times, so a call at step 0 opens a
    fresh bar and the final call (``done``) closes it.
    """

    def __init__(self, total: int):
        self.total = total
        self.bar = None

    def __call__(self, step, value, grad_norm, done):
        from tqdm.auto import tqdm

        step = int(step)
        if self.bar is None or (step == 0 and not done):  # a new run of the compiled loop
            if self.bar is not None:
                self.bar.close()
            self.bar = tqdm(total=self.total, desc="fit", unit="step", leave=True)
        self.bar.n = max(self.bar.n, step)
        self.bar.set_postfix(value=f"{float(value):.8g}", grad_norm=f"{float(grad_norm):.3g}",
                             refresh=True)
        if bool(done):  # the steps taken are the whole run: a fit that converged is 100%
            self.bar.total = self.bar.n
            self.bar.close()
            self.bar = None


# ------------------------------------------------------------------------------- loop


def _tree_all_finite(tree: PyTree) -> jax.Array:
    leaves = jax.tree.leaves(tree)
    return functools.reduce(jnp.logical_and, [jnp.all(jnp.isfinite(x)) for x in leaves])


def _tree_any_changed(new: PyTree, old: PyTree) -> jax.Array:
    diffs = [jnp.any(a != b) for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(old))]
    return functools.reduce(jnp.logical_or, diffs)


_LINESEARCH_STATES = (optax.ScaleByZoomLinesearchState, optax.ScaleByBacktrackingLinesearchState)


def _linesearch_state(state: PyTree):
    """The one line-search state in ``state`` that stores value and gradient, or None."""
    found = [
        s
        for s in jax.tree.leaves(state, is_leaf=lambda s: isinstance(s, _LINESEARCH_STATES))
        if isinstance(s, _LINESEARCH_STATES) and s.grad is not None
    ]
    return found[0] if len(found) == 1 else None


class _Newton(NamedTuple):
    """Newton's step at an iterate."""

    direction: jax.Array  # the modified Newton step, flat (ravel_pytree order)
    decrement2: jax.Array  # the squared Newton decrement g^T |H|^-1 g (>= 0)
    singular: jax.Array  # H is singular within its rounding (`_rank_floor`)


class _LoopState(NamedTuple):
    """The carry of fit's ``lax.while_loop``. ``loss`` is the minimised ``sign * objective``."""

    params: PyTree  # the current iterate
    loss: jax.Array  # sign * objective at params
    grad_norm: jax.Array  # the norm of the loss's gradient at params
    step: jax.Array  # steps taken (int32)
    history: jax.Array  # the objective after each step; NaN beyond `step`
    status: jax.Array  # _RUNNING or a FitStatus
    previous: tuple  # (params, loss, grad_norm, hessian) before the last step (divergence)
    inner: PyTree  # optax: (its state, the gradient at params); Newton: (_Newton, first pass)
    hessian: jax.Array | None  # Newton: the loss's Hessian at params (flat); optax: None


def _grad_hessian(loss: Callable, flat: jax.Array):
    """``loss``'s gradient and Hessian at the vector ``flat``, reverse-over-reverse as
    :func:`fusedlp.hessian` (fusedlp kernels have no forward mode), keeping the inner pass's
    gradient. Not the value: formed inside the differentiated function, it would be carried
    through the linearisation (a kernel's conditional passes and their residuals) only to
    be dropped, in time and in compiled code."""

    def grad_and_aux(v):
        g = jax.grad(loss)(v)
        return g, g

    H, g = jax.jacrev(grad_and_aux, has_aux=True)(flat)
    return g, H


def _value_grad_hessian(loss: Callable, flat: jax.Array):
    """``loss``, its gradient and its Hessian at the vector ``flat`` (the value by a plain
    call, see `_grad_hessian`)."""
    g, H = _grad_hessian(loss, flat)
    return loss(flat), g, H


def _rank_floor(dtype, n: int) -> float:
    """The smallest eigenvalue, relative to the largest, that a unit-diagonal ``n x n``
    Hessian resolves: ``n eps``, the tolerance of ``numpy.linalg.matrix_rank``. An exactly
    collinear design gives about ``eps`` there; an ill-conditioned but regular problem, a
    raw polynomial in calendar years, 1e-11 (docs/fitting.md)."""
    return n * float(jnp.finfo(dtype).eps)


def _modified_newton(g: jax.Array, H: jax.Array) -> _Newton:
    """The Newton step of a minimisation, kept a descent direction where ``H`` is not
    positive definite: eigenvalues replaced by their absolute values, and those that are
    numerically zero raised to a floor.

    ``H`` is first scaled to unit diagonal (``D^-1 H D^-1``, ``D = sqrt|diag H|``), so that
    the cut (`_rank_floor` times the largest eigenvalue) and the floor (``sqrt(eps)`` times
    it) do not depend on the parameters' units. Where the scaled ``H`` is positive definite
    this is the exact Newton step, however ill-conditioned; a direction of negative
    curvature is followed downhill at its own curvature's scale. A direction below the cut
    is damped by the floor (its gradient component may be rounding: inverting the cut
    itself made the steps wander along a collinear design), and ``singular`` records it.
    Flooring every eigenvalue at ``sqrt(eps)``, as before, damped the weak direction of
    ill-conditioned regular problems into a crawl.
    """
    eps = float(jnp.finfo(H.dtype).eps)
    d = jnp.sqrt(jnp.abs(jnp.diagonal(H)))
    d = jnp.where(d > 0, d, 1.0)
    w, Q = jnp.linalg.eigh(H / d[:, None] / d[None, :])
    a = jnp.abs(w)
    kept = a > _rank_floor(H.dtype, H.shape[0]) * jnp.max(a)
    a = jnp.where(kept, a, jnp.maximum(math.sqrt(eps) * jnp.max(a), jnp.finfo(H.dtype).tiny))
    c = Q.T @ (g / d)
    return _Newton(direction=-(Q @ (c / a)) / d, decrement2=jnp.sum(c * c / a),
                   singular=~jnp.all(kept))


def _armijo(value, trial, alpha, decrement2):
    """Whether ``trial`` (the loss a step ``alpha`` along the Newton direction) is finite
    and lower than ``value`` by Armijo's condition.

    Where the decrease Newton predicts (``decrement2 / 2``) is below the loss's own rounding,
    values cannot rank the points: a step whose loss is equal within that rounding is
    taken, since the gradient, which still resolves the optimum, chose it.
    """
    slack = 8 * float(jnp.finfo(value.dtype).eps) * jnp.abs(value)
    lower = (trial < value) & (trial <= value - _ARMIJO * alpha * decrement2)
    return jnp.isfinite(trial) & (lower | (decrement2 <= slack) & (trial <= value + slack))


def _singular(step, at, H, decrement2):
    """Whether Newton's steps have stopped shrinking: the squared decrement at the new
    point ``at`` is over a quarter of the last ``step``'s own, ``step^T H step`` (H the new
    Hessian), and that step was not negligible against ``at``.

    Near a regular optimum Newton converges quadratically and the ratio falls towards 0.
    Along a runaway towards a finite limit of the objective, f - limit ~ A exp(-c t) in the
    distance t, every step has the length 1/c and the ratio is 1: the decrement falls below
    any ``tol`` as the objective flattens while the parameters grow without bound. (At a
    finite optimum whose Hessian is singular, f ~ t^4, each step covers a third of the
    distance left and the ratio is 0.44.) Both measures are
    invariant to linear reparameterisation, as the decrement is; a step within rounding of
    the parameters (the decrement's own noise floor) is not judged.
    """
    eps = float(jnp.finfo(at.dtype).eps)
    own = step @ (H @ step)
    visible = jnp.max(jnp.abs(step)) > math.sqrt(eps) * jnp.max(jnp.abs(at))
    return visible & (own > 0) & (decrement2 > 0.25 * own)


def _backtrack(loss: Callable, flat, value, direction, decrement2, alpha, trials):
    """The first of the steps ``alpha``, ``alpha``/2, ... (at most ``trials`` of them) along
    ``direction`` that `_armijo` accepts against ``value``; returns ``(new_flat, trial,
    found)``: ``flat`` itself if none is found, and the last loss evaluated (the new
    point's if found; ``value`` if none was)."""

    def cond(s):
        _, j, found, _ = s
        return ~found & (j < trials)

    def body(s):
        a, j, _, _ = s
        a = jnp.where(j > 0, 0.5 * a, a)
        trial = loss(flat + a * direction)
        return a, j + 1, _armijo(value, trial, a, decrement2), trial

    start = (jnp.asarray(alpha, flat.dtype), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.bool_),
             value)
    a, _, found, trial = jax.lax.while_loop(cond, body, start)
    return jnp.where(found, flat + a * direction, flat), trial, found


def _verdict(max_steps, params, loss, gnorm, step, moved, done, ok, singular=False):
    """The status after judging an iterate: ``done`` (the convergence test), ``ok`` (the
    method's own finiteness) and ``singular`` (``done`` holds only as the curvature
    vanishes, `_singular`) given; loss, gradient norm and params must be finite too."""
    # gnorm is finite iff every gradient entry is (or the norm overflows: also divergence)
    ok = ok & jnp.isfinite(loss) & jnp.isfinite(gnorm) & _tree_all_finite(params)
    status = jnp.where(step >= max_steps, FitStatus.MAX_STEPS, _RUNNING)
    status = jnp.where(moved, status, FitStatus.STALLED)
    status = jnp.where(done, jnp.where(singular, FitStatus.SINGULAR, FitStatus.CONVERGED),
                       status)
    return jnp.where(ok, status, FitStatus.DIVERGED).astype(jnp.int32)


def _select(pred, on_true: PyTree, on_false: PyTree) -> PyTree:
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class _Settings(NamedTuple):
    """What both loops share: the loss, its sign, the step limit and the progress report."""

    loss_fn: Callable
    sign: float
    max_steps: int
    report: Callable  # report(step, loss, grad_norm, status)


def _first_state(cfg: _Settings, params, loss, gnorm, inner, hessian=None) -> _LoopState:
    history = jnp.full((cfg.max_steps + 1,), jnp.nan, dtype=loss.dtype).at[0].set(
        cfg.sign * loss)
    return _LoopState(params=params, loss=loss, grad_norm=gnorm, step=jnp.zeros((), jnp.int32),
                      history=history, status=jnp.asarray(_RUNNING, jnp.int32),
                      previous=(params, loss, gnorm, hessian), inner=inner, hessian=hessian)


def _newton_loop(cfg: _Settings, params, rtol, lockstep: bool) -> _LoopState:
    """Newton's loop: each pass moves to a point along the last Newton step that `_armijo`
    accepts (halving from the full step, at most `_MAX_HALVINGS` times, else ``STALLED``)
    and forms the loss's gradient, Hessian and next Newton step there. The first pass takes
    ``params`` itself (a zero step).

    A single fit forms the loss, gradient and Hessian at the full step in one program, so
    that the objective's shared work (X beta) is formed once, and takes it if accepted.
    Where it is not, the pass searches the halved steps by the loss alone, and the next
    pass forms the gradient and Hessian where the search landed (a recentring pass: a zero
    step, taken as it is). Under ``vmap`` (``lockstep``) every pass runs for the whole
    batch while any member runs, and one member's recentring pass would be one more pass
    for all: there each pass searches by the loss from the full step, then forms the
    gradient and Hessian where it landed (timings of both in docs/performance.md)."""
    _, unravel = ravel_pytree(params)

    def loss_flat(v):
        return cfg.loss_fn(unravel(v))

    def judged(s, at, value, g, H, moved, previous, recentre):
        """The state at the flat point ``at``, with its loss, gradient and Hessian."""
        newton = _modified_newton(g, H)
        gnorm = optax.tree.norm(unravel(g))
        step = s.step + (moved & ~recentre).astype(jnp.int32)
        # the last step: from the iterate to go back to (before the search, for a
        # recentring pass; at the start its loss is NaN and nothing is judged)
        singular = _singular(at - ravel_pytree(previous[0])[0], at, H, newton.decrement2)
        status = _verdict(cfg.max_steps, unravel(at), value, gnorm, step, moved | recentre,
                          newton.decrement2 <= rtol**2,
                          _tree_all_finite((newton.direction, newton.decrement2)),
                          moved & singular | newton.singular)
        return _LoopState(params=unravel(at), loss=value, grad_norm=gnorm, step=step,
                          history=s.history.at[step].set(cfg.sign * value), status=status,
                          previous=previous, inner=(newton, jnp.asarray(False)), hessian=H)

    def body(s: _LoopState) -> _LoopState:
        newton, recentre = s.inner
        flat = ravel_pytree(s.params)[0]
        running = s.status == _RUNNING
        before = (s.params, s.loss, s.grad_norm, s.hessian)
        if lockstep:
            # A finished member's pass is discarded: its search stops at once, not after the
            # halvings the batch would wait on. At the start, +inf accepts any finite loss.
            at, trial, found = _backtrack(
                loss_flat, flat, jnp.where(recentre, jnp.inf, s.loss), newton.direction,
                newton.decrement2, 1.0, jnp.where(recentre | ~running, 1, _MAX_HALVINGS + 1))
            g, H = _grad_hessian(loss_flat, at)
            out = judged(s, at, jnp.where(found | recentre, trial, s.loss), g, H, found,
                         before, recentre)
        else:
            full = flat + newton.direction  # flat itself on a recentring pass
            value, g, H = _value_grad_hessian(loss_flat, full)
            taken = recentre | _armijo(s.loss, value, 1.0, newton.decrement2)
            at, trial, found = _backtrack(loss_flat, flat, s.loss, newton.direction,
                                          newton.decrement2, 0.5,
                                          jnp.where(taken | ~running, 0, _MAX_HALVINGS))
            # taken: the step with its own gradient and Hessian (a recentring pass keeps
            # the iterate before the search as the one to go back to)
            at_full = judged(s, full, value, g, H, taken, _select(recentre, s.previous, before),
                             recentre)
            # else moved where the search found, its gradient and Hessian next pass; or
            # no improving step (the last pass judged the iterate: not converged)
            zero = _Newton(direction=jnp.zeros_like(flat), decrement2=jnp.zeros_like(value),
                           singular=jnp.asarray(False))
            loss = jnp.where(found, trial, s.loss)
            step = s.step + found.astype(jnp.int32)
            searched = s._replace(
                params=unravel(at), loss=loss, step=step,
                history=s.history.at[step].set(cfg.sign * loss),
                status=jnp.where(found, s.status, FitStatus.STALLED).astype(jnp.int32),
                previous=before, inner=(_select(found, zero, newton), found))
            out = _select(taken, at_full, searched)
        cfg.report(out.step, out.loss, out.grad_norm, out.status)
        return out

    flat = ravel_pytree(params)[0]
    start = _Newton(direction=jnp.zeros_like(flat), decrement2=jnp.zeros((), flat.dtype),
                    singular=jnp.asarray(False))
    # value and gradient norm are formed by the first pass; here only their dtypes
    loss = jnp.full((), jnp.nan, jax.eval_shape(cfg.loss_fn, params).dtype)
    gnorm = jnp.full_like(optax.tree.norm(params), jnp.nan)
    hessian = jnp.full((flat.size, flat.size), jnp.nan, flat.dtype)
    s = _first_state(cfg, params, loss, gnorm, (start, jnp.asarray(True)), hessian)
    return jax.lax.while_loop(lambda s: s.status == _RUNNING, body, s)


def _optax_loop(cfg: _Settings, optimizer, params, rtol, atol) -> _LoopState:
    """The loop of an optax optimizer: value and gradient after each update, then the
    verdict (the gradient methods' test, see `fit`)."""
    value_and_grad = jax.value_and_grad(cfg.loss_fn)
    opt = optax.with_extra_args_support(optimizer)
    # A line search (L-BFGS's) has already evaluated value and gradient at the new params
    # and keeps them in its state: reuse them, as optax.value_and_grad_from_state does.
    opt_state = opt.init(params)
    reuse = _linesearch_state(opt_state) is not None
    loss0, grad = value_and_grad(params)

    def verdict(params, loss, gnorm, step, moved, prev_loss):
        # scaled by the smaller of |f| and |f(init)|, with a last step that changed f as
        # little, and never worse than at the start: an objective that runs away (either
        # way) cannot meet it
        bound = atol + rtol * jnp.minimum(jnp.abs(loss), jnp.abs(loss0))
        done = (gnorm <= bound) & (jnp.abs(loss - prev_loss) <= bound) & (loss <= loss0)
        return _verdict(cfg.max_steps, params, loss, gnorm, step, moved, done, True)

    def body(s: _LoopState) -> _LoopState:
        opt_state, grad = s.inner
        updates, opt_state = opt.update(grad, opt_state, s.params, value=s.loss, grad=grad,
                                        value_fn=cfg.loss_fn)
        new_params = optax.apply_updates(s.params, updates)
        if reuse:
            ls = _linesearch_state(opt_state)
            new_loss, grad = ls.value, ls.grad
        else:
            new_loss, grad = value_and_grad(new_params)
        gnorm = optax.tree.norm(grad)
        step = s.step + 1
        status = verdict(new_params, new_loss, gnorm, step,
                         _tree_any_changed(new_params, s.params), s.loss)
        cfg.report(step, new_loss, gnorm, status)
        return _LoopState(
            params=new_params, loss=new_loss, grad_norm=gnorm, step=step,
            history=s.history.at[step].set(cfg.sign * new_loss), status=status,
            previous=(s.params, s.loss, s.grad_norm, None), inner=(opt_state, grad),
            hessian=None)

    gnorm = optax.tree.norm(grad)
    s = _first_state(cfg, params, loss0, gnorm, (opt_state, grad))
    status = verdict(params, loss0, gnorm, s.step, jnp.asarray(True), loss0)
    cfg.report(s.step, loss0, gnorm, status)
    s = s._replace(status=status)
    if cfg.max_steps > 0:  # (with no step to take, compile no loop)
        s = jax.lax.while_loop(lambda s: s.status == _RUNNING, body, s)
    return s


def _progress_report(every: int, max_steps: int, sign: float) -> Callable:
    """``report(step, loss, grad_norm, status)`` for the loops: the progress bar's update
    every ``every`` steps while running (and at step 0), or nothing."""
    if not every:
        return lambda *args: None
    bar = _ProgressBar(max_steps)

    def report(step, loss, gnorm, status):
        jax.lax.cond(
            (step % every == 0) & ((status == _RUNNING) | (step == 0)),
            lambda: jax.debug.callback(bar, step, sign * loss, gnorm, False),
            lambda: None,
        )

    report.bar = bar
    return report


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _fit_loop(objective, optimizer, maximize, max_steps, every, lockstep, params, data, rtol,
              atol):
    sign = -1.0 if maximize else 1.0
    # the loop computes in the parameters' precision (float32 params with a float64
    # objective, under x64, would otherwise mix dtypes in the loop's state)
    dtype = ravel_pytree(params)[0].dtype

    def loss_fn(p):  # minimised, as optax does
        return jnp.asarray(sign * objective(p, *data), dtype)

    report = _progress_report(every, max_steps, sign)
    cfg = _Settings(loss_fn=loss_fn, sign=sign, max_steps=max_steps, report=report)
    if optimizer == "newton":  # fit has resolved every other name
        s = _newton_loop(cfg, params, rtol, lockstep)
    else:
        s = _optax_loop(cfg, optimizer, params, rtol, atol)
    # A diverging step was computed and carried like any other: restore the last finite
    # iterate, which rode along (at step 0 there is none).
    back = (s.status == FitStatus.DIVERGED) & (s.step > 0)
    params, loss, gnorm, hessian = _select(back, s.previous,
                                           (s.params, s.loss, s.grad_norm, s.hessian))
    step = s.step - back.astype(s.step.dtype)
    history = jnp.where(jnp.arange(max_steps + 1) <= step, s.history, jnp.nan)
    if every:
        jax.debug.callback(report.bar, step, sign * loss, gnorm, True)
    return FitResult(
        params=params,
        value=sign * loss,
        grad_norm=gnorm,
        num_steps=step,
        converged=s.status == FitStatus.CONVERGED,
        status=s.status,
        history=history,
        hessian=None if hessian is None else cfg.sign * hessian,
    )


# -------------------------------------------------------------------------------- API


def _num_params(params: PyTree) -> int:
    return sum(int(np.size(x)) for x in jax.tree.leaves(params))


def _resolve_optimizer(optimizer, params: PyTree):
    """``"newton"`` or an optax transformation, from what :func:`fit` was given."""
    if optimizer is None:
        return "newton" if _num_params(params) <= NEWTON_MAX_PARAMS else default_optimizer()
    if isinstance(optimizer, str):
        if optimizer == "newton":
            return "newton"
        if optimizer == "lbfgs":
            return default_optimizer()
        raise ValueError(f"fit: optimizer must be 'newton', 'lbfgs' or an optax "
                         f"GradientTransformation, got {optimizer!r}")
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(f"fit: optimizer must be 'newton', 'lbfgs' or an optax "
                        f"GradientTransformation, got {type(optimizer).__name__}")
    return optimizer


def _check_finite_start(result: FitResult, objective, init_params, data) -> None:
    """Raise if a concrete fit ended at step 0 on a non-finite objective or gradient (a
    fit whose first step diverged and was undone also ends at step 0, with finite ones).
    The objective is then called once more, outside the compiled loop, with the kernels'
    validation on: where a kernel's argument is the cause, its own message (the argument
    and the first offending index) is quoted."""
    if not (_checks.is_concrete(result) and int(result.status) == FitStatus.DIVERGED
            and int(result.num_steps) == 0):
        return
    value, gnorm = float(result.value), float(result.grad_norm)
    if math.isfinite(value) and math.isfinite(gnorm):
        return
    cause = None
    try:
        with _checks.validation(True):
            objective(init_params, *data)
    except ValueError as e:  # a kernel's validation
        cause = e
    except Exception:  # not the answer here: the usual causes are listed below
        pass
    what = "the objective" if not math.isfinite(value) else "the objective's gradient"
    head = f"fit: {what} is not finite at init_params (value {value}, gradient norm {gnorm})."
    if cause is not None:
        raise ValueError(f"{head} Called once with fusedlp.validation() on, a kernel says: "
                         f"{cause}") from cause
    raise ValueError(
        f"{head} The usual cause is data outside a kernel's support: non-integer or negative "
        "counts for poisson_lpmf, poisson_log_lpmf, negative_binomial_lpmf or "
        "binomial_logit_lpmf, y outside {0, 1} for bernoulli_logit_lpmf, x <= 0 for "
        "gamma_lpdf; or init_params outside the parameters' domain (a scale or rate <= 0). "
        "Under jit or vmap this fit returns status DIVERGED at step 0 instead."
    )


def fit(
    objective: Callable[..., jax.Array],
    init_params: PyTree,
    *data: Any,
    optimizer: str | optax.GradientTransformation | None = None,
    maximize: bool = True,
    max_steps: int = 1000,
    tol: ArrayLike | None = None,
    atol: ArrayLike | None = None,
    progress: bool | int = False,
    validate: bool = True,
) -> FitResult:
    r"""Maximise ``objective(params, *data)`` (or minimise it) in one compiled loop.

    The whole optimisation is one ``lax.while_loop`` inside one jitted computation: it is
    traced and compiled once per (objective, optimizer, settings, shapes and dtypes) and
    runs without Python between steps. ``fit`` composes with ``jax.jit`` (bind
    ``objective`` and the keyword settings with ``functools.partial``) and with
    ``jax.vmap`` over data or initial values (each fit in the batch stops on its own; the
    loop runs until the slowest one is done). The first call compiles; later calls with
    the same shapes reuse the compilation.

    **Optimizers.** ``"newton"`` (the default up to :data:`NEWTON_MAX_PARAMS` scalar
    parameters): each step takes the Hessian over all parameter leaves flattened together,
    reverse-over-reverse as :func:`fusedlp.hessian` does, scales it to unit diagonal,
    replaces its eigenvalues by their absolute values and raises those at or below
    ``n eps`` times the largest, numerically zero, to ``sqrt(eps)`` times it (the exact
    Newton step where the objective is concave, however ill-conditioned, an ascent
    direction where it is not: one symmetric eigendecomposition per step, no retries, so
    every fit in a ``vmap`` batch does the same work), and backtracks from the full step by halving
    until the objective is finite and rises by Armijo's condition (at most 30 halvings; a
    step that does not improve the objective is not taken, except where the rise Newton
    predicts is below the objective's rounding and values cannot rank the points). Its
    steps do not depend on the parameters' units, so badly scaled GLMs converge in a
    handful of steps, as IRLS does. optax's backtracking line search is not used: it keeps
    its last, possibly non-improving step when it runs out of halvings, and its stored
    gradient needs forward mode, which fusedlp kernels do not have. ``"lbfgs"`` (the default
    above :data:`NEWTON_MAX_PARAMS`): ``optax.lbfgs()``, see :func:`default_optimizer`. Or
    any optax ``GradientTransformation``.

    **What CONVERGED promises.** Checked at ``init_params`` and after every step, at the
    returned ``params``, whose objective and gradient are finite. With ``"newton"``: the
    Newton decrement :math:`\lambda = \sqrt{g^\top |H|^{-1} g}` is at most ``tol``
    (:math:`|H|` the modified Hessian above). For a log-likelihood :math:`\lambda` is the
    length of the Newton step in standard-error units, so ``params`` lie within about
    ``tol`` standard errors of the maximum; it does not change when a parameter is
    rescaled, and it does not involve the objective's level, so an objective that runs
    away never meets it. Parameters that run away while the objective tends to a finite
    limit do meet it, as the curvature vanishes with the gradient: there Newton's steps
    stop shrinking (each as long as the last, where a regular optimum's shrink
    quadratically), and the fit ends ``SINGULAR``, not converged: when the decrement meets
    ``tol`` and the squared decrement is over a quarter of the last step's own
    (:math:`s^\top H s`), that step not within rounding of ``params``. So does a fit whose
    Hessian at the end is singular (an eigenvalue raised above: collinear covariates,
    where the optimum is not unique). With a gradient method (L-BFGS, optax): with
    ``f`` the objective and ``f_0`` its value at ``init_params``,

    .. math::  \lVert g \rVert_2 \le b, \quad |f - f_\text{prev}| \le b, \quad
               f \text{ no worse than } f_0, \qquad
               b = \mathrm{atol} + \mathrm{tol}\,\min(|f|, |f_0|)

    (:math:`f_\text{prev}` the objective before the last step).

    A log-likelihood of ``n`` observations has :math:`|f| \propto n` and
    :math:`\lVert g \rVert \approx n\,\lVert\delta\rVert` for a parameter error
    :math:`\delta`, so ``tol`` is roughly the relative accuracy of the parameters. Taking
    the smaller of :math:`|f|` and :math:`|f_0|`, a last step that moved :math:`f` no more
    than that, and no loss against the start keep a runaway objective (whose :math:`|f|`
    grows, in steps that change it) from passing. Either test
    finds a stationary point, not necessarily a maximum: :func:`standard_errors` and
    :func:`fusedlp.summary` warn where the curvature is not that of a strict maximum.
    ``tol=0`` runs ``max_steps`` steps unless the test holds exactly.

    **Divergence and stalling.** A step whose objective, gradient, Newton step or
    parameters are not finite is rejected and ends the fit with ``DIVERGED``: ``params``,
    ``value`` and ``grad_norm`` are those of the last finite iterate. A fit that can make
    no progress ends ``STALLED``: Newton's line search found no improving step in 30
    halvings, or an optax step left the parameters bit-for-bit unchanged (typically
    ``tol`` is below what the precision allows, or the optimum is at infinity). A gradient
    method has no curvature to tell a runaway towards a finite limit (perfect separation)
    from an optimum: there only Newton's ``SINGULAR`` does. Only ``CONVERGED`` sets
    ``converged``.

    **Validation.** Concrete (non-traced) ``data`` and ``init_params`` are checked before
    anything is compiled: an empty data array, or a NaN or infinity in a floating leaf,
    raises ``ValueError`` naming it (``data[1]``, ``data[0]['y']``, ``init_params['loc']``).
    An objective that is not finite at concrete ``init_params`` raises ``ValueError`` too,
    naming the usual cause (data outside a kernel's support, such as non-integer counts).
    Traced inputs, inside ``jit`` or ``vmap``, cannot be inspected: there a NaN or a
    non-finite start shows up as ``status = DIVERGED`` (at step 0 for the start).
    ``validate=False`` skips the data check, for data that hold non-finite values on
    purpose (padding under an ``eam_energy`` mask).

    Args:
      objective: ``objective(params, *data) -> scalar``: a log-likelihood or
        log-density (maximised), or with ``maximize=False`` an energy or loss (minimised).
        Must be reverse-mode differentiable in ``params``, twice for ``"newton"`` (every
        fusedlp kernel is).
      init_params: starting point, any pytree of floating arrays (a dict is usual); integer
        leaves are converted to the default float dtype.
      *data: the remaining arguments of ``objective``: arrays or pytrees of arrays.
      optimizer: ``"newton"``, ``"lbfgs"`` or any optax ``GradientTransformation``.
        Default (None): ``"newton"`` for up to :data:`NEWTON_MAX_PARAMS` scalar parameters,
        ``"lbfgs"`` above. Plain transformations (``optax.adam(1e-2)``) are called as
        ``update(grads, state, params)``; ``GradientTransformationExtraArgs`` also get
        ``value``, ``grad`` and ``value_fn`` (what optax's line searches need). A line
        search's stored value and gradient are reused at the next step, so it must be the
        last transformation of a chain (as in ``optax.lbfgs``). Create an optax optimizer
        once and reuse it: a new object means a new compilation.
      maximize: True (default) to maximise ``objective``; False to minimise it. Either
        way ``value`` and ``history`` report ``objective`` itself, unnegated.
      max_steps: most optimizer steps (a Python int; it sets the length of ``history``).
      tol: the convergence tolerance (see above). Default by the parameters' dtype: for
        ``"newton"`` ``sqrt(eps)`` (1.5e-8 in float64, 3.5e-4 in float32); for gradient
        methods 1e-8 in float64, 1e-5 in float32.
      atol: absolute gradient tolerance of the gradient methods (Newton's decrement needs
        none). Default: equal to ``tol``.
      progress: True shows a tqdm progress bar (needs ``tqdm``: the ``progress`` extra),
        updated from inside the compiled loop (``jax.debug.callback``) about 100 times per
        ``max_steps``; an int ``k`` updates it every ``k`` steps. Switched off when ``fit``
        itself is called under ``vmap``; a ``vmap`` of an already jitted ``fit`` cannot be
        detected, and would update one bar per batch element: pass False there.
      validate: check concrete data and initial values (see above).

    Returns:
      A :class:`FitResult`: ``params``, ``value``, ``grad_norm``, ``num_steps``,
      ``converged``, ``status``, ``history``.

    Raises:
      ValueError: concrete ``data`` or ``init_params`` that are empty or not finite; an
        objective that is not finite at concrete ``init_params``; a ``max_steps`` that is
        not a non-negative int; an unknown optimizer name.
      TypeError: ``init_params`` with non-real leaves; an optimizer that is not optax.
      ImportError: ``progress`` without tqdm installed.

    Examples:
      Poisson regression with a log link, and the coefficients' standard errors:

      >>> import jax, jax.numpy as jnp, numpy as np, fusedlp
      >>> rng = np.random.default_rng(0)
      >>> X = np.column_stack([np.ones(500), rng.normal(size=500)])
      >>> k = rng.poisson(np.exp(X @ np.array([0.5, -0.3])))
      >>> def poisson_loglik(params, X, k):
      ...     return fusedlp.poisson_log_lpmf(k, X @ params["beta"], normalized=False)
      >>> res = fusedlp.fit(poisson_loglik, {"beta": jnp.zeros(2)}, X, k)
      >>> bool(res.converged), [round(float(b), 2) for b in res.params["beta"]]
      (True, [0.49, -0.26])
      >>> se = fusedlp.standard_errors(poisson_loglik, res.params, X, k)
      >>> [round(float(s), 3) for s in se["beta"]]
      [0.036, 0.033]

      Normal linear regression (the MLE of ``beta`` is the least-squares solution):

      >>> y = X @ np.array([1.0, 2.0]) + rng.normal(0.0, 0.5, size=500)
      >>> def normal_loglik(params, X, y):
      ...     return fusedlp.normal_lpdf(y, X @ params["beta"], jnp.exp(params["log_sigma"]))
      >>> res = fusedlp.fit(normal_loglik, {"beta": jnp.zeros(2), "log_sigma": 0.0}, X, y)
      >>> bool(np.allclose(res.params["beta"], np.linalg.lstsq(X, y)[0], rtol=1e-6))
      True

      An energy is minimised (``maximize=False``): fit the EAM density
      :math:`\rho(r) = A e^{-\beta r}` and the embedding's cubic and quartic coefficients
      to reference energies of 12 configurations (4 sites x 8 neighbours). ``c_2 = 1``
      stays fixed: rescaling ``A`` and every ``c_k`` together leaves the energies unchanged.

      >>> r = rng.uniform(0.5, 2.5, size=(12, 4, 8))
      >>> def energies(theta, r):
      ...     density = (jnp.exp(theta["log_A"]), jnp.exp(theta["log_beta"]))
      ...     embedding = jnp.stack([0.0, 1.0, theta["c3"], theta["c4"]])
      ...     return jax.vmap(lambda rc: fusedlp.eam_energy(
      ...         rc, density=density, embedding=embedding))(r)
      >>> truth = {"log_A": np.log(0.8), "log_beta": np.log(1.5), "c3": 1.0, "c4": 0.25}
      >>> e_ref = energies(truth, r)
      >>> def squared_error(theta, r, e_ref):
      ...     return jnp.sum((energies(theta, r) - e_ref) ** 2)
      >>> start = {"log_A": 0.0, "log_beta": 0.0, "c3": 0.5, "c4": 0.5}
      >>> res = fusedlp.fit(squared_error, start, r, e_ref, maximize=False)
      >>> p = res.params
      >>> fitted = [jnp.exp(p["log_A"]), jnp.exp(p["log_beta"]), p["c3"], p["c4"]]
      >>> bool(np.allclose(fitted, [0.8, 1.5, 1.0, 0.25], rtol=0.02))
      True

      (In float64 to about 1e-10; in float32 to about 1e-3: this fit's Hessian has a
      condition number near 1e5.)
    """
    if not isinstance(max_steps, (int, np.integer)) or isinstance(max_steps, bool) \
            or max_steps < 0:
        raise ValueError(f"fit: max_steps must be a non-negative int, got {max_steps!r}")
    if not isinstance(progress, (bool, int, np.integer)) or progress < 0:
        raise ValueError(f"fit: progress must be True/False or a non-negative int (update "
                         f"every that many steps), got {progress!r}")
    for name, value in (("tol", tol), ("atol", atol)):
        if value is not None and _checks.is_concrete(value) and not float(value) >= 0.0:
            raise ValueError(f"fit: {name} must be >= 0, got {value!r}")
    params = _as_float_params(init_params)
    if validate:
        _check_concrete("init_params", params, allow_empty=True)
        for i, d in enumerate(data):
            _check_concrete(f"data[{i}]", d, allow_empty=False)
    optimizer = _resolve_optimizer(optimizer, params)
    newton = optimizer == "newton"
    if tol is None:
        dtype = jnp.result_type(*jax.tree.leaves(params))
        tol = _default_newton_tol(dtype) if newton else _default_tol(dtype)
    atol = tol if atol is None else atol
    every = 0
    if progress and not _under_vmap(params, data):
        try:
            import tqdm  # noqa: F401
        except ImportError:
            raise ImportError("fit: progress=True needs tqdm (pip install tqdm; from a fusedlp "
                              "clone, pip install '.[progress]')")
        every = max(1, max_steps // 100) if progress is True else int(progress)
    result = _fit_loop(objective, optimizer, bool(maximize), int(max_steps), every,
                       _under_vmap(params, data), params, tuple(data), tol, atol)
    _check_finite_start(result, objective, params, data)
    return result


def standard_errors(
    objective: Callable[..., jax.Array],
    params: PyTree,
    *data: Any,
    maximize: bool = True,
) -> PyTree:
    r"""Asymptotic standard errors :math:`\sqrt{\operatorname{diag}((-H)^{-1})}` at ``params``.

    ``H`` is the Hessian of ``objective(params, *data)`` over all parameter leaves
    flattened together (``jax.flatten_util.ravel_pytree``), taken reverse-over-reverse
    as :func:`fusedlp.hessian` does (fusedlp kernels have no forward mode). At a maximum of
    a log-likelihood, :math:`(-H)^{-1}` is the inverse observed information: the usual
    asymptotic covariance of the MLE. Standard errors are in the parametrisation of
    ``params`` (for a ``log_scale``, the error of the log).

    Args:
      objective: as in :func:`fit`: a log-likelihood, or with ``maximize=False`` a negative
        log-likelihood (then ``H`` itself is inverted).
      params: where to evaluate, usually ``fit(...).params``.
      *data: the remaining arguments of ``objective``.
      maximize: False if ``objective`` is a negative log-likelihood.

    Returns:
      A pytree shaped like ``params``. All NaN, with a ``RuntimeWarning`` when the result
      is concrete, if the objective is not finite at ``params`` or the (negated) Hessian
      is not positive definite (not a strict maximum: a saddle, a flat direction,
      unidentified parameters).

    Example:
      >>> import jax.numpy as jnp, fusedlp
      >>> y = jnp.array([1.0, 2.0, 4.0, 5.0])
      >>> loglik = lambda p, y: fusedlp.normal_lpdf(y, p["loc"], p["scale"])
      >>> se = fusedlp.standard_errors(loglik, {"loc": 3.0, "scale": jnp.sqrt(2.5)}, y)
      >>> round(float(se["loc"]), 4)  # scale / sqrt(n)
      0.7906
    """
    params = _as_float_params(params)
    _, cov, finite, pos_def = _covariance(objective, bool(maximize), params, tuple(data))
    _warn_if_unusable("standard_errors", finite, pos_def)
    flat, unravel = ravel_pytree(params)
    return unravel(jnp.sqrt(jnp.diagonal(cov)).astype(flat.dtype))


def _warn_if_unusable(who: str, finite, pos_def) -> None:
    """The RuntimeWarning for a concrete non-finite objective or non-maximum."""
    if not _checks.is_concrete(finite, pos_def):
        return
    finite, pos_def = np.asarray(finite), np.asarray(pos_def)
    if not finite.all():
        msg = "the objective is not finite at these params; returning NaN"
    elif not pos_def.all():
        msg = ("the negated Hessian is not positive definite at these params (not a strict "
               "maximum); returning NaN")
    else:
        return
    warnings.warn(f"{who}: {msg}", RuntimeWarning, stacklevel=3)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _covariance(objective, maximize, params, data):
    """Log-likelihood at ``params`` and ``(-H)^-1`` over the flattened parameters (NaN
    unless the log-likelihood is finite and ``-H`` positive definite), and those two
    conditions."""
    flat, unravel = ravel_pytree(params)
    sign = 1.0 if maximize else -1.0
    loglik, _, H = _value_grad_hessian(lambda v: sign * objective(unravel(v), *data), flat)
    return _inverse_information(loglik, H)


@jax.jit
def _inverse_information(loglik, H):
    """`_covariance` given the log-likelihood and its Hessian."""
    chol = jnp.linalg.cholesky(-H)  # -H: the observed information; NaN if not pos. def.
    finite = jnp.isfinite(loglik)
    pos_def = jnp.all(jnp.isfinite(chol))
    cov = jax.scipy.linalg.cho_solve((chol, True), jnp.eye(H.shape[0], dtype=chol.dtype))
    return loglik, jnp.where(finite & pos_def, cov, jnp.nan), finite, pos_def
