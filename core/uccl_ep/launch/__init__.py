"""Launch recipes: declarative (framework, model, platform) files rendered into Slurm batch
scripts, a one-command Ray launch, or local processes. See `uccl-ep launch --help` and
docs/quickstart.md."""

from .catalog import find_recipe, list_recipes, load
from .frameworks import build_plan
from .plan import Plan
from .schema import FRAMEWORKS, PLATFORMS, Recipe, load_recipe

__all__ = ["Recipe", "Plan", "FRAMEWORKS", "PLATFORMS", "load", "load_recipe", "find_recipe", "list_recipes",
           "build_plan"]
