"""Primus-Turbo's in-tree ROCm DeepEP (the TURBO backend): not built in this stand-in."""

raise ImportError("primus_turbo.pytorch.deep_ep (the TURBO EP backend's ROCm kernels) is not built in the "
                  "Primus-Turbo stand-in: a run that selects TURBO fails here")
