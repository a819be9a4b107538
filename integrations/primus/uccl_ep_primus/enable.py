"""``import uccl_ep_primus.enable``: register uccl_ep with Primus-Turbo and check that Primus-Turbo's
own selection picks it (`uccl_ep_primus.activate`); raises, naming the cause, when it would not."""

from . import activate

activate()
