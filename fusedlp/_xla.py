"""The XLA idioms the kernels rely on, named once, each with the reason it exists.

XLA:CPU reduces a select-free elementwise expression in one vectorised pass, but a
reduction fed by a per-element select (``jnp.where``, a comparison turned into a number)
runs element by element, with every transcendental function in it scalar: several times
slower (docs/performance.md has the measurements). So a kernel's common path is written
without selects, and everything a select would decide (edges, invalid parameters, corner
regimes where the fast form loses accuracy) is made to show up as a non-finite sum; only
then a second, exact pass with selects runs (`fast_or_exact`).

These layouts are XLA:CPU's. Elsewhere (a GPU: `LAYOUT`) each kernel runs its exact pass
alone: on an H100 that measured as fast or faster at N = 10^7, where the XLA:CPU layouts
were 1.4-4.6x slower for the Poisson kernel (docs/gpu.md). The price: the exact pass's
misses at extreme points (tests/test_accuracy.py) then hold at every size.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import custom_batching

# The size thresholds, in one place. Below each, the exact (select) pass runs directly:
# the data sit in cache and the fallback's fixed cost is more than the pass it would skip
# (docs/performance.md). Each was measured on XLA:CPU for the layout named.

# the select-free common path of the accurate kernels and of fuse's "cond" layout
SMALL = 2048
# fuse's "columns" layout (plain arithmetic f: each output in a computation of its own)
SMALL_ARITHMETIC = 16384
# the normal kernel's select-free sums with a scalar scale
SMALL_NORMAL = 8192
# the normalized Poisson's exact pass: its lax.cond between the log k! table alone and
# table plus series
SMALL_POISSON_TABLE = 128
# fuse's "exact" layout sums f's terms directly up to this size in float64, from written
# terms above (its selects' temporaries then exceed glibc's mmap threshold)
DIRECT_MAX = 2**20
# the exact pass behind a fast one runs over blocks of this many elements (`blockwise`)
BLOCK = 65536

# Which layouts a trace uses: "cpu" (the select-free fast passes, fences, blocks and size
# thresholds of this module, chosen and measured on XLA:CPU), "plain" (every kernel's exact
# pass alone: no lax.cond, no loop over blocks; faster on a GPU, docs/gpu.md), or None: "cpu"
# where the default backend is the CPU, else "plain" (the default backend, not the device a
# computation is placed on). Read when a kernel is traced, and jax keeps traces: a change
# takes effect for new traces only (jax.clear_caches()).
LAYOUT: str | None = None


def cpu_layouts() -> bool:
    """Whether the kernel being traced uses the XLA:CPU layouts (see `LAYOUT`)."""
    if LAYOUT not in (None, "cpu", "plain"):
        raise ValueError(f"fusedlp._xla.LAYOUT must be None, 'cpu' or 'plain', not {LAYOUT!r}")
    if LAYOUT is not None:
        return LAYOUT == "cpu"
    return jax.default_backend() == "cpu"


def below(n: float, threshold: float) -> bool:
    """Whether a pass of ``n`` elements runs as the exact pass alone: up to ``threshold``
    elements under the XLA:CPU layouts, at every size under the plain ones."""
    return n <= threshold or not cpu_layouts()


def nan_unless_nonneg(a):
    """0 where ``a >= 0`` and finite, NaN where ``a < 0``, ``a = inf`` or NaN: a parameter
    verdict in arithmetic (no select). Its derivative is never taken."""
    a = jax.lax.stop_gradient(a)
    return jnp.sqrt(a) - jnp.sqrt(a)


def nan_unless_all_nonneg(*arrays):
    """0 where every one of ``arrays`` is >= 0 and finite, NaN elsewhere (broadcast): one
    `nan_unless_nonneg` of their least, which NaN reaches too (min and max pass NaN on), and
    their greatest less itself, NaN where it is inf. Many verdicts for the price of one
    square root."""
    arrays = [jax.lax.stop_gradient(a) for a in arrays]
    least, most = arrays[0], arrays[0]
    for a in arrays[1:]:
        least, most = jnp.minimum(least, a), jnp.maximum(most, a)
    return nan_unless_nonneg(least) + (most - most)


def nan_unless_whole(a):
    """0 where ``a`` is a finite whole number, NaN elsewhere: a count's verdict in
    arithmetic (with `nan_unless_nonneg` for its sign)."""
    return nan_unless_nonneg(jnp.floor(a) - a)


def step(a):
    """1 where ``a > 0``, 0 where ``a <= 0`` (NaN stays NaN), in arithmetic: a mask for
    blending two branches as ``m * f + (1 - m) * g``, exact for m in {0, 1} and finite f,
    g. Constant pieces: its derivative is zero."""
    # Not clip, nor min(max(.)), which XLA turns into a clamp: XLA:CPU writes a clamp
    # feeding a reduction out as an array. floor(1/2) = 0 at a = 0: never a mask of 1/2.
    return jax.lax.stop_gradient(jnp.floor(0.5 + 0.5 * jnp.sign(a)))


def split_sharding(x):
    """``x``'s sharding where its type names mesh axes that split it (Explicit axes, as
    ``jax.make_mesh`` makes by default), else None (one device, Auto axes, replicated)."""
    sharding = getattr(jax.typeof(x), "sharding", None) if hasattr(jax, "typeof") else None
    if sharding is not None and any(axis is not None for axis in sharding.spec):
        return sharding
    return None


def fenced(fn: Callable, shapes, *arrays):
    """``fn(*arrays)``, whose outputs are shaped as the pytree of ``jax.ShapeDtypeStruct``
    ``shapes``, formed in a computation of its own, compiled once, also under ``vmap``.

    Two uses, one reason: XLA:CPU splits a long select-free expression fed to a reduction
    into many loops that each write an array, where terms written by one loop of their own
    are summed by a plain reduction (docs/performance.md); and it fuses a long chain of
    cheap operations into every consumer, so a consumer that reads each element several
    times (a product with each basis vector of an outer jacrev) forms the chain once per
    read. A lax.cond is a fence XLA neither fuses nor shares across; here its predicate
    always holds (``x * 0 + 1 != 0``, NaN and inf included, which XLA cannot fold for
    floats), the other branch gives zeros of ``shapes`` (never taken; given, so that ``fn``
    is traced and compiled once), and the predicate is one for a whole ``vmap`` batch
    (`batch_all`), so that the cond stays a cond there. ``arrays[0]`` must be traced (not a
    constant), or XLA folds the fence away.
    """
    leaves = jax.tree.leaves(arrays)
    first = leaves[0]
    if (first.size == 0 or any(split_sharding(a) is not None for a in leaves)
            or not cpu_layouts()):
        # nothing to fence; or split over mesh axes: no single element to probe (jax
        # refuses the slice), each device runs its own block anyway, and the never-taken
        # branch's zeros would not carry the split (a scalar first argument beside split
        # data: the second-order rule's rows of a parameter without hand partials); or not
        # on XLA:CPU
        return fn(*arrays)
    if any(_varying(a) for a in leaves):
        # in a shard_map: the zeros must vary over the mesh axes as fn's outputs do, which
        # only fn's own types tell
        shapes = jax.eval_shape(fn, *arrays)
    holds = batch_all(first.reshape(-1)[0] * 0 + 1 != 0)
    return jax.lax.cond(holds, fn, lambda *_: jax.tree.map(_zeros, shapes), *arrays)


def typed_per_device(x) -> bool:
    """Whether ``x``'s type names mesh axes: split over Explicit ones (`split_sharding`) or
    varying over a shard_map's. Values made for it (a lax.cond branch's) must carry them."""
    return split_sharding(x) is not None or bool(_varying(x))


def _varying(x) -> frozenset:
    """The shard_map mesh axes over which ``x`` (or a ShapeDtypeStruct) varies."""
    if not isinstance(x, jax.ShapeDtypeStruct) and not hasattr(jax, "typeof"):
        return frozenset()  # a jax before shard_map's varying types
    kind = x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)
    manual = getattr(kind, "manual_axis_type", None)
    return frozenset(getattr(manual, "varying", None) or getattr(kind, "vma", None) or ())


def _zeros(s: jax.ShapeDtypeStruct) -> jax.Array:
    z = jnp.zeros(s.shape, s.dtype)
    axes = _varying(s)
    return jax.lax.pcast(z, tuple(axes), to="varying") if axes else z


@custom_batching.custom_vmap
def batch_all(pred):
    """``pred`` (a scalar boolean), and under ``vmap`` one verdict for the whole batch: all
    members' ``pred``. A lax.cond on it then stays a cond under vmap; on a batched predicate
    it becomes a select that runs both branches. Callers choose branches that are right
    for every member either way (a faster one where ``pred`` holds)."""
    return pred


@batch_all.def_vmap
def _batch_all_batched(axis_size, in_batched, pred):
    del axis_size, in_batched
    # again through batch_all: under a vmap of vmaps the outer batch reduces too
    return batch_all(jnp.all(pred)), False


def over_members(fn: Callable, in_batched) -> Callable:
    """``fn`` vmapped over the members of a batch, as a custom_vmap rule receives them: the
    arguments ``in_batched`` says are batched along their leading axis, the others shared."""
    return jax.vmap(fn, in_axes=[0 if b else None for b in in_batched])


def all_batched(out):
    """A custom_vmap rule's ``out_batched`` for outputs batched along their leading axis."""
    return jax.tree.map(lambda _: True, out)


def none_batched(out):
    """A custom_vmap rule's ``out_batched`` for outputs shared by the batch (only tangents
    were batched: forward mode)."""
    return jax.tree.map(lambda _: False, out)


def blockwise(fn: Callable, flat, batched, *, fallback: bool = False):
    """``fn(*flat)`` computed over blocks of `BLOCK` elements, in a loop.

    ``flat`` are the arguments, each a vector of the same n elements where ``batched`` says
    so, else a scalar shared by every element; ``fn`` returns a pytree whose leaves are
    sums over its elements (scalars: added up over the blocks) or per-element vectors
    (joined). An exact pass writes each of its per-element selects out as a temporary array:
    in blocks these stay block-sized, instead of a dozen N-sized arrays that the program
    allocates on every call, exact pass taken or not, and the pass itself runs faster
    (docs/performance.md). Up to two blocks, and where the process has several devices,
    ``fn`` runs on the whole: the data may then be split over a mesh with Auto axes, which
    no trace-time type shows, and a block's slice of them would gather them. A
    ``fallback`` (an exact pass that runs only where a fast one fails) is split from above
    one block, into blocks that divide it evenly (`_block_size`; else it stays whole): its
    temporaries are allocated on every call, pass taken or not. A fast pass stays whole up
    to two blocks, where blocks made some slower (docs/performance.md).

    Under ``vmap`` a batch of passes too short to split (problems of fewer than two blocks
    each) is split by members instead: as many members per block as fill one, ``fn``
    vmapped over each block (the batch size is known only there, so `_by_members` is
    the batching rule of a `jax.custom_batching.custom_vmap`); a ``fallback`` batch of
    one to two blocks, as above, into blocks of members that divide it evenly.
    """
    n = next(a.shape[0] for a, b in zip(flat, batched) if b)
    if jax.device_count() > 1 or not cpu_layouts():
        return fn(*flat)
    if n // BLOCK >= 2:
        return _in_blocks(fn, flat, batched, n, _block_size(n))

    @custom_batching.custom_vmap
    def whole(*a):
        size = _even_blocks(n, BLOCK) if fallback else None
        return fn(*a) if size is None else _in_blocks(fn, a, batched, n, size)

    @whole.def_vmap
    def _by_members(axis_size, in_batched, *a):
        if not any(jax.tree.leaves(in_batched)):  # batched tangents only (forward mode)
            out = fn(*a)
            return out, none_batched(out)
        each = over_members(fn, in_batched)
        per = max(1, BLOCK // n)  # members per block
        size = (per if axis_size // per >= 2
                else _even_blocks(axis_size, per) if fallback else None)
        out = each(*a) if size is None else _in_blocks(each, a, in_batched, axis_size, size)
        return out, all_batched(out)

    return whole(*flat)


def data_sum(term: Callable, *flat) -> jax.Array:
    """The sum of the elementwise ``term`` over the vectors ``flat`` (data, all of one
    length), in a reduction of its own: it reads the data alone, so that inside a loop (a
    fit's, a sampler's) XLA hoists it out of the loop and it runs once, where a part of
    the per-element pass runs at every step. Summed from terms written by a loop of their
    own (`fenced`: XLA:CPU splits a long expression fed to a reduction into loops that
    each write an array), over blocks (`blockwise`)."""
    if not flat[0].size:
        return jnp.zeros((), flat[0].dtype)

    def summed(*fl):
        terms = jax.vmap(term)
        return jnp.sum(fenced(terms, jax.eval_shape(terms, *fl), *fl))

    return blockwise(summed, list(flat), [True] * len(flat))


def _even_blocks(n: int, block: int) -> int | None:
    """For a fallback of more than one block and fewer than two: a `_block_size` that
    divides ``n``, or None (then it stays whole: a remainder block would be a second copy
    of the pass to compile)."""
    size = _block_size(n, block)
    return size if n > block and n % size == 0 else None


def _block_size(n: int, block: int | None = None) -> int:
    """The largest divisor of ``n`` between half a block and a block (`BLOCK` elements
    unless ``block`` is given), else the block: blocks that divide ``n`` leave no
    remainder, which would be a second copy of the pass in the program (its summed outputs
    rule out `_in_blocks`'s overlapping last block)."""
    block = BLOCK if block is None else block
    return next((n // m for m in range(-(-n // block), 2 * n // block + 1)
                 if n % m == 0 and 2 * (n // m) > block), block)


def _in_blocks(fn: Callable, arrays, batched, n: int, size: int):
    """`blockwise`'s loop: ``fn`` over slices of ``size`` along the leading axis of the
    ``batched`` arrays (of length ``n``), its scalar outputs added up, the others joined."""
    m = n // size

    def block(start, length):
        return fn(*(jax.lax.dynamic_slice_in_dim(a, start, length) if b else a
                    for a, b in zip(arrays, batched)))

    def add(acc, out, start):
        return [jax.lax.dynamic_update_slice_in_dim(a, o, start, 0) if o.ndim else a + o
                for a, o in zip(acc, jax.tree.leaves(out))]

    leaves, tree = jax.tree.flatten(jax.eval_shape(lambda: block(0, size)))
    acc = [jnp.zeros((n, *x.shape[1:]) if x.ndim else (), x.dtype) for x in leaves]
    # with outputs all joined, a last block ending at n rewrites some of the one before with
    # equal values, so the loop covers the rest without a second copy of ``fn``
    overlap = m * size < n and all(x.ndim for x in leaves)

    def each(j, acc):
        start = jnp.minimum(j * size, n - size)
        return add(acc, block(start, size), start)

    acc = jax.lax.fori_loop(0, m + overlap, each, acc)
    if m * size < n and not overlap:
        acc = add(acc, block(m * size, n - m * size), m * size)
    return jax.tree.unflatten(tree, acc)


def _unless(ok, out, redo: Callable):
    """``out`` if ``ok``, else ``redo()``: a ``while_loop`` of at most one trip rather than a
    ``lax.cond``, whose branch that returns ``out`` is a copy of each of its arrays on
    XLA:CPU; a loop's carry passes them through in place."""
    def body(carry):
        return redo(), jnp.ones((), jnp.bool_)

    return jax.lax.while_loop(lambda carry: ~carry[1], body, (out, ok))[0]


def fast_or_exact(n: int, fast: Callable, exact: Callable, *arrays,
                  exact_blocks: Callable | None = None, accurate: bool = False,
                  exact_sees_fast: bool = False):
    """``fast(*arrays)`` if all its outputs are finite, else ``exact(*arrays)`` (`_unless`).

    ``fast`` is the select-free common path (a summed value and its partials): it must give
    a non-finite output whenever any element is an edge or outside the regime where it is
    accurate. ``exact`` handles every input. Up to `SMALL` elements ``exact`` runs alone,
    unless ``vmap`` makes a batch of such problems larger than that (the batching rule of a
    `jax.custom_batching.custom_vmap`, where the batch size is known), or ``accurate`` says
    that ``fast`` is also the more accurate of the two (the hand partials' second
    derivatives: the exact pass's lose all digits at extreme points, tests/test_accuracy.py).
    Under ``vmap`` the verdict is one for the whole batch (`batch_all`): one non-finite
    member sends the batch to the exact pass, which is right for every member.

    The fast pass runs once, ahead of the loop that passes its result on. Differentiated
    (only second derivatives, `fusedlp.hessian`, differentiate a forward rule: the Poisson
    kernels'; fuse's forward rule has a second-order rule of its own), the exact pass
    alone is: a second derivative's forward-mode tangents are written out as arrays
    whatever the layout, so the select-free form gains nothing there, while differentiating
    both passes and the choice made a Newton fit's program several times slower to trace and
    compile (docs/performance.md); and no zero cotangent of an untaken fast pass can meet
    its infinite local derivatives at an edge element (0 * inf = NaN).

    ``exact_blocks``, if given, is ``exact`` computed by `blockwise`: the pass the primal
    program runs when the fast one fails (its temporaries block-sized). The derivatives
    stay those of ``exact`` itself.

    Off the XLA:CPU layouts (`LAYOUT`) ``exact`` runs alone, unless ``accurate``: then the
    choice is made as on XLA:CPU.

    With ``exact_sees_fast``, ``exact`` is called as ``exact(fast(*arrays), *arrays)``: it
    may keep what the fast pass got right, and after that pass it reuses its result instead
    of compiling a second copy of it.
    """
    if exact_sees_fast:
        given_fast = exact

        def exact(*a):
            return given_fast(fast(*a), *a)

    def finite(out):
        total = jax.lax.stop_gradient(sum(jnp.sum(leaf) for leaf in jax.tree.leaves(out)))
        return batch_all(jnp.isfinite(total))

    def fast_then_exact(*a):
        out = fast(*a)
        if exact_sees_fast:
            return _unless(finite(out), out, lambda: given_fast(out, *a))
        return _unless(finite(out), out, lambda: (exact_blocks or exact)(*a))

    if not (cpu_layouts() or accurate):
        chosen = exact
    elif n > SMALL or accurate:
        chosen = fast_then_exact
    else:
        @custom_batching.custom_vmap
        def chosen(*a):
            return exact(*a)

        @chosen.def_vmap
        def _in_a_batch(axis_size, in_batched, *a):
            if not any(in_batched):  # batched tangents only (forward mode)
                out = exact(*a)
                return out, none_batched(out)
            # a batch of small problems is one large pass: the threshold counts all of it
            total = n * axis_size
            # (not on data split over an Explicit mesh: jax 0.10.2 loses the mesh when it
            # batches the inner choice's custom_jvp under jit, docs/sharding.md)
            split = any(split_sharding(x) is not None for x in jax.tree.leaves(a))
            each = (functools.partial(fast_or_exact, total, fast, exact,
                                      exact_blocks=exact_blocks, accurate=accurate)
                    if total > SMALL and not split else exact)
            out = over_members(each, in_batched)(*a)
            return out, all_batched(out)

    @jax.custom_jvp
    def pick(*a):
        return chosen(*a)

    @pick.defjvp
    def _pick_jvp(primals, tangents):
        return jax.jvp(exact, primals, tangents)

    return pick(*arrays)
