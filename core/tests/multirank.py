"""Multi-rank test helper: the package's own bounded process launcher (uccl_ep.spawn)."""

from uccl_ep.spawn import RankFailure, free_port, run_ranks

__all__ = ["run_ranks", "free_port", "RankFailure"]
