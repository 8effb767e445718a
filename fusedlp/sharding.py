"""Data parallelism: observations split over the devices of a mesh.

The kernels and :func:`fusedlp.fit` need nothing special to run on sharded data: each
device evaluates its own block of observations and the partial sums, and the gradients of
replicated parameters, are combined by one cross-device reduction (an XLA all-reduce) inside
the compiled program. The data themselves never move; the cotangent of a sharded argument
comes back sharded like it. :func:`shard` places a user's data that way.

Uneven sizes. A jax array split along an axis must split it evenly (jax rejects a
``NamedSharding`` whose device count does not divide the axis). ``shard(..., pad=True)``
pads the observation axis with zeros (``False`` for a boolean leaf) up to a multiple of the
device count and also returns ``valid``, a boolean vector that is ``False`` on the padding.
The objective then makes every padded observation contribute nothing: exactly, except for
the normal density, whose padding is cancelled to rounding:

==================  =========================================================================
kernel              padded observations neutralised by
==================  =========================================================================
poisson_log_lpmf    ``log_rate = jnp.where(valid, log_rate, -jnp.inf)``: with the padded
                    ``k = 0`` each term is exactly 0, with derivative 0.
poisson_lpmf        ``rate = jnp.where(valid, rate, 0.0)``: with ``k = 0``, exactly 0.
eam_energy          ``mask = valid[:, None] & mask`` (or ``jnp.broadcast_to(valid[:, None],
                    r.shape)``): padded sites have no neighbours and contribute exactly 0.
normal_lpdf         ``loc = jnp.where(valid, loc, 0.0)`` so that ``z = 0`` on the padding,
                    where each element then adds exactly ``-log(scale) - log(2 pi)/2``; add
                    ``jnp.sum(~valid) * (jnp.log(scale) + 0.5 * jnp.log(2 * jnp.pi))`` back
                    (only the ``log`` term with ``normalized=False``). For an array
                    ``scale``, ``scale = jnp.where(valid, scale, 1.0)`` instead leaves the
                    constant ``-log(2 pi)/2`` per padded element (0 with ``normalized=False``).
==================  =========================================================================

The ``jnp.where`` also stops the gradient at the padding, so the parameters' gradients equal
the unpadded ones. (Without it, a regression's zero-padded design rows would still give
``beta`` the right gradient, since ``X @ beta`` has a zero derivative there, but the value
would count the padded terms.) The normal density has no ``x`` whose log-density is 0 for
every scale, hence the correction there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ("data_mesh", "shard")

PyTree = Any


def data_mesh(devices: Sequence[jax.Device] | None = None, axis_name: str = "data") -> Mesh:
    """A one-axis mesh over ``devices`` (default: every device of every process).

    The axis is of type ``Auto`` (where the installed jax has axis types): jax and XLA
    propagate shardings through the program by themselves, and code written for one device
    runs unchanged. (``jax.make_mesh``'s own default in recent jax is ``Explicit``, which
    also works with the kernels but asks for a ``with jax.set_mesh(mesh):`` block around
    the calls that differentiate through matrix products over the sharded axis.)
    """
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise ValueError("data_mesh: no devices")
    axis_type = getattr(jax.sharding, "AxisType", None)
    kwargs = {} if axis_type is None else {"axis_types": (axis_type.Auto,)}
    return jax.make_mesh((len(devices),), (axis_name,), devices=devices, **kwargs)


def _mesh_axes(mesh: Mesh, axes: str | Sequence[str] | None) -> tuple[str, ...]:
    if axes is None:
        return tuple(mesh.axis_names)
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    unknown = [a for a in axes if a not in mesh.axis_names]
    if unknown:
        raise ValueError(f"shard: mesh has no axis {unknown[0]!r} (axes {mesh.axis_names})")
    return axes


def _padded_source(arr: np.ndarray, n: int, n_total: int, axis: int, dtype):
    """A callback for ``jax.make_array_from_callback``: ``arr`` in ``dtype``, zero-padded
    along ``axis`` to ``n_total``, without materialising a padded or converted copy: each
    device's block is cut from ``arr`` on its own (``arr`` may be a memory map)."""

    def block(index):
        index = tuple(index) + (slice(None),) * (arr.ndim - len(index))
        start, stop, _ = index[axis].indices(n_total)
        head = index[:axis]
        tail = index[axis + 1:]
        real = np.asarray(arr[head + (slice(min(start, n), min(stop, n)),) + tail], dtype)
        missing = (stop - start) - real.shape[axis]
        if missing <= 0:
            return real
        pad = [(0, 0)] * real.ndim
        pad[axis] = (0, missing)
        return np.pad(real, pad)  # zeros; False for booleans

    return block


def shard(
    data: PyTree,
    mesh: Mesh | None = None,
    *,
    axis: int = 0,
    mesh_axes: str | Sequence[str] | None = None,
    pad: bool = False,
) -> PyTree:
    """Split every array in ``data`` along its observation axis over the devices of ``mesh``.

    Data parallelism for the kernels and :func:`fusedlp.fit`: each device holds one block of
    observations; parameters stay replicated. A jitted kernel or fit then reduces its partial
    sums and parameter gradients across devices inside XLA (an all-reduce), never gathering
    the data on one device, and the gradient of a sharded argument comes back sharded like
    it. The result equals the unsharded one up to the order of the floating-point sum.

    Args:
      data: an array or any pytree of arrays (numpy or jax), e.g. ``(X, y)``. Array leaves
        with at least ``axis + 1`` dimensions are split along ``axis``; 0-d arrays are
        replicated on every device; other leaves (Python numbers, None) are left alone.
      mesh: the device mesh (default :func:`data_mesh`: all devices, one axis).
      axis: the observation axis of every split leaf (the sites of an ``eam_energy`` ``r``
        of shape ``(sites, neighbours)``: 0).
      mesh_axes: the mesh axis or axes to split over (default: all of them, so that every
        device of the mesh holds a distinct block).
      pad: if False, the observation axis of every split leaf must be divisible by the
        number of devices it is split over. If True, it is zero-padded up to the next
        multiple (``False`` in boolean leaves), every split leaf must then have the same
        length along it, and ``(sharded, valid)`` is returned: ``valid`` is a boolean
        vector, split like the data, that is ``False`` on the padding. How to make the
        padding contribute exactly nothing to each kernel is in :mod:`fusedlp.sharding`.

    Returns:
      ``data`` with its array leaves replaced by sharded ``jax.Array`` s; with ``pad=True``
      the pair ``(data, valid)``.

    Raises:
      ValueError: an axis not divisible by the device count (with ``pad=False``), split
        leaves of different lengths (with ``pad=True``), no leaf to split (with
        ``pad=True``), or an unknown mesh axis.

    Numpy leaves are copied to the devices block by block with
    ``jax.make_array_from_callback``, so each process of a multi-process run copies only
    the blocks of its own devices (every process must be able to index the full array; a
    ``numpy.memmap`` will do). When each process instead holds only its own rows, build
    the global array with ``jax.make_array_from_process_local_data`` (see the README).

    Example:
      >>> import jax.numpy as jnp, numpy as np, fusedlp
      >>> X = np.column_stack([np.ones(10), np.linspace(-1.0, 1.0, 10)])
      >>> k = np.arange(10) % 3
      >>> (Xs, ks), valid = fusedlp.shard((X, k), pad=True)
      >>> def loglik(params, X, k, valid):
      ...     eta = jnp.where(valid, X @ params["beta"], -jnp.inf)  # padding adds 0
      ...     return fusedlp.poisson_log_lpmf(k, eta)
      >>> res = fusedlp.fit(loglik, {"beta": jnp.zeros(2)}, Xs, ks, valid)
      >>> bool(res.converged)
      True
    """
    mesh = data_mesh() if mesh is None else mesh
    if not isinstance(axis, (int, np.integer)) or axis < 0:
        raise ValueError(f"shard: axis must be a non-negative int, got {axis!r}")
    axes = _mesh_axes(mesh, mesh_axes)
    n_dev = math.prod(mesh.shape[a] for a in axes)
    spec_axes = axes[0] if len(axes) == 1 else axes
    split = NamedSharding(mesh, P(*([None] * axis), spec_axes))
    replicated = NamedSharding(mesh, P())

    leaves, treedef = jax.tree_util.tree_flatten_with_path(data)
    is_array = lambda x: isinstance(x, (jax.Array, np.ndarray, np.generic))  # noqa: E731
    lengths = {jax.tree_util.keystr(path): np.shape(x)[axis] for path, x in leaves
               if is_array(x) and np.ndim(x) > axis}
    if pad:
        if not lengths:
            raise ValueError(f"shard: no array leaf has an axis {axis} to split")
        if len(set(lengths.values())) > 1:
            listed = ", ".join(f"data{k or ''}: {n}" for k, n in lengths.items())
            raise ValueError(f"shard: with pad=True every split leaf must have the same "
                             f"length along axis {axis}, got {listed}")
        n = next(iter(lengths.values()))
        n_total = -(-n // n_dev) * n_dev
    else:
        for where, n in lengths.items():
            if n % n_dev:
                raise ValueError(
                    f"shard: data{where or ''} has {n} entries along axis {axis}, not "
                    f"divisible by the {n_dev} devices it is split over; pass pad=True to "
                    f"pad it (and get a mask of the real entries)")

    def place(x):
        if not is_array(x):
            return x
        if np.ndim(x) <= axis:
            return jax.device_put(x, replicated)
        n_x = np.shape(x)[axis]
        total = n_total if pad else n_x
        if isinstance(x, jax.Array):
            if total != n_x:
                widths = [(0, 0)] * x.ndim
                widths[axis] = (0, total - n_x)
                x = jnp.pad(x, widths)
            return jax.device_put(x, split)
        x = x if isinstance(x, np.ndarray) else np.asarray(x)
        shape = x.shape[:axis] + (total,) + x.shape[axis + 1:]
        dtype = jax.dtypes.canonicalize_dtype(x.dtype)  # float32 unless x64 is on
        return jax.make_array_from_callback(
            shape, split, _padded_source(x, n_x, total, axis, dtype))

    out = jax.tree_util.tree_unflatten(treedef, [place(x) for _, x in leaves])
    if not pad:
        return out
    valid_sharding = NamedSharding(mesh, P(spec_axes))
    valid = jax.make_array_from_callback(
        (n_total,), valid_sharding, lambda index: np.arange(n_total)[index] < n)
    return out, valid
