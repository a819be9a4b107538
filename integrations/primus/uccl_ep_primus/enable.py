"""``import uccl_ep_primus.enable`` registers uccl_ep as Primus-Turbo's "UCCL" EP backend."""

from . import register

register()
