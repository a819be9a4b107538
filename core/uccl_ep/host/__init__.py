"""The host executor (`backend="host"`): DeepEP's LL and HT protocols run by CPU threads over
CPU tensors, through the same 16-byte commands, proxy and transports the GPU kernels use."""

__all__ = ["HostExecutor", "unavailable_reason"]


def __getattr__(name):
    if name in __all__:
        from . import executor
        return getattr(executor, name)
    raise AttributeError(name)
