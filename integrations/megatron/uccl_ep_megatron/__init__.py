"""uccl-ep for Megatron-Core: ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend uccl``.

Three ways in, all ending in `install()` before Megatron parses its arguments:

- launcher: ``uccl-ep-megatron pretrain_gpt.py <megatron args>`` (or ``python -m uccl_ep_megatron``,
  which also works under ``torchrun ... -m uccl_ep_megatron pretrain_gpt.py ...``);
- one line at the top of your own training script: ``import uccl_ep_megatron.enable``;
- Megatron-Core as a library: ``uccl_ep_megatron.install()`` then
  ``TransformerConfig(..., moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="uccl")``,
  with knobs from ``uccl_ep_megatron.configure(timeout_s=..., backend=...)``.

Tested megatron-core window: 0.19.0..0.19.2 (other releases install with a warning); see `versions`.
"""

from __future__ import annotations

from .config_patch import BACKEND_NAME
from .settings import UcclSettings, configure, current
from .versions import TESTED_VERSIONS, TESTED_WINDOW

__version__ = "0.1.0"
__all__ = ["install", "uninstall", "is_installed", "configure", "current", "UcclSettings", "BACKEND_NAME",
           "TESTED_WINDOW", "TESTED_VERSIONS", "__version__"]

_installed = False


def install() -> None:
    """Install the hook into the imported megatron-core (idempotent).

    Adds "uccl" to TransformerConfig.moe_flex_dispatcher_backend (and so to Megatron's
    ``--moe-flex-dispatcher-backend`` choices), routes the flex dispatcher's "uccl" backend to
    uccl_ep.Buffer, wires it into the EP-overlap schedule as "deepep" is (`overlap`), and adds
    the ``--uccl-*`` flags to Megatron's parser when megatron.training is present. Warns (once)
    on a megatron-core outside the tested window.
    """
    global _installed
    if _installed:
        return
    from .args import patch_megatron_arguments
    from .config_patch import patch_transformer_config
    from .manager import patch_flex_dispatcher
    from .overlap import patch_overlap_schedule
    from .versions import check_megatron_core_version

    check_megatron_core_version()
    patch_transformer_config()
    patch_flex_dispatcher()
    patch_overlap_schedule()
    patch_megatron_arguments()
    _installed = True


def uninstall() -> None:
    """Undo `install` (tests)."""
    global _installed
    from .args import unpatch_megatron_arguments
    from .config_patch import unpatch_transformer_config
    from .manager import unpatch_flex_dispatcher
    from .overlap import unpatch_overlap_schedule

    unpatch_megatron_arguments()
    unpatch_overlap_schedule()
    unpatch_flex_dispatcher()
    unpatch_transformer_config()
    _installed = False


def is_installed() -> bool:
    return _installed
