"""``import uccl_ep_megatron.enable`` installs the hook (put it before importing megatron.training).

Equivalent to ``uccl_ep_megatron.install()``; after it, Megatron's own parser accepts
``--moe-flex-dispatcher-backend uccl`` and the ``--uccl-*`` flags.
"""

from . import install

install()
