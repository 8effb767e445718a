"""fusedlp: log-densities whose gradients cost about as much as their values.

Each kernel returns the sum of an elementwise log-density (a scalar, like Stan's ``_lpdf``)
and carries a hand-derived ``jax.custom_vjp`` rule that reuses the forward pass.
"""

from fusedlp import constraints as constraints
from fusedlp._checks import enable_validation as enable_validation
from fusedlp._checks import validation as validation
from fusedlp._fuse import fuse as fuse
from fusedlp._hessian import hessian as hessian
from fusedlp._pointwise import pointwise as pointwise
from fusedlp.binomial import bernoulli_logit_lpmf as bernoulli_logit_lpmf
from fusedlp.binomial import binomial_logit_lpmf as binomial_logit_lpmf
from fusedlp.eam import eam_energy as eam_energy
from fusedlp.fitting import FitResult as FitResult
from fusedlp.fitting import FitStatus as FitStatus
from fusedlp.fitting import fit as fit
from fusedlp.fitting import standard_errors as standard_errors
from fusedlp.gamma import gamma_lpdf as gamma_lpdf
from fusedlp.inference import FitSummary as FitSummary
from fusedlp.inference import summary as summary
from fusedlp.negative_binomial import negative_binomial_lpmf as negative_binomial_lpmf
from fusedlp.normal import normal_lpdf as normal_lpdf
from fusedlp.poisson import poisson_log_lpmf as poisson_log_lpmf
from fusedlp.poisson import poisson_lpmf as poisson_lpmf
from fusedlp.sharding import shard as shard
from fusedlp.student_t import student_t_lpdf as student_t_lpdf

__version__ = "0.1.0"

__all__ = (
    "FitResult",
    "FitStatus",
    "FitSummary",
    "bernoulli_logit_lpmf",
    "binomial_logit_lpmf",
    "eam_energy",
    "enable_validation",
    "fit",
    "fuse",
    "gamma_lpdf",
    "hessian",
    "negative_binomial_lpmf",
    "normal_lpdf",
    "pointwise",
    "poisson_log_lpmf",
    "poisson_lpmf",
    "shard",
    "standard_errors",
    "student_t_lpdf",
    "summary",
    "validation",
)
