"""uccl-ep-deploy: launch recipes -- declarative (framework, model, platform) files rendered into
Slurm batch scripts, a one-command Ray launch, or local processes. See `uccl-ep launch --help`
(or `uccl-ep-launch --help`) and docs/quickstart.md. Imports neither torch nor uccl_ep."""

from .catalog import find_recipe, list_recipes, load
from .errors import DeployError, InvalidArgument, MissingDependency, Timeout
from .frameworks import build_plan
from .plan import Plan
from .schema import FRAMEWORKS, PLATFORMS, Recipe, load_recipe

__version__ = "0.1.0"
__all__ = ["Recipe", "Plan", "FRAMEWORKS", "PLATFORMS", "load", "load_recipe", "find_recipe", "list_recipes",
           "build_plan", "DeployError", "InvalidArgument", "MissingDependency", "Timeout"]
