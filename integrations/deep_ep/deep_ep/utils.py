"""``deep_ep.utils``: DeepEP's event types (Megatron-Core: ``from deep_ep.utils import EventHandle,
EventOverlap``) plus the test helpers DeepEP's own test scripts import."""

from uccl_ep.utils import EventHandle, EventOverlap, calc_diff, per_token_cast_back, per_token_cast_to_fp8

__all__ = ["EventHandle", "EventOverlap", "calc_diff", "per_token_cast_to_fp8", "per_token_cast_back"]
