"""fusedlp: log-densities whose gradients cost about as much as their values.

Each kernel returns the sum of an elementwise log-density (a scalar, like Stan's ``_lpdf``)
and carries a hand-derived ``jax.custom_vjp`` rule that reuses the forward pass.
"""

from fusedlp._checks import enable_validation as enable_validation
from fusedlp._checks import validation as validation
from fusedlp._hessian import hessian as hessian
from fusedlp.eam import eam_energy as eam_energy
from fusedlp.fitting import FitResult as FitResult
from fusedlp.fitting import FitStatus as FitStatus
from fusedlp.fitting import fit as fit
from fusedlp.fitting import standard_errors as standard_errors
from fusedlp.normal import normal_lpdf as normal_lpdf
from fusedlp.poisson import poisson_log_lpmf as poisson_log_lpmf
from fusedlp.poisson import poisson_lpmf as poisson_lpmf
from fusedlp.sharding import shard as shard

__version__ = "0.1.0"

__all__ = (
    "FitResult",
    "FitStatus",
    "eam_energy",
    "enable_validation",
    "fit",
    "hessian",
    "normal_lpdf",
    "poisson_log_lpmf",
    "poisson_lpmf",
    "shard",
    "standard_errors",
    "validation",
)
