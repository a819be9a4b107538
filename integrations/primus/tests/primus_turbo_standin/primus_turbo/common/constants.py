"""Primus-Turbo's environment-variable keys (stand-in: the one the EP registry reads)."""

#: MoE dispatch/combine EP backend: TURBO (default), DEEP_EP, ... (upper-cased by the manager).
ENV_MOE_DISPATCH_COMBINE_BACKEND = "PRIMUS_TURBO_MOE_DISPATCH_COMBINE_BACKEND"
ENV_AUTO_TUNE = "PRIMUS_TURBO_AUTO_TUNE"
