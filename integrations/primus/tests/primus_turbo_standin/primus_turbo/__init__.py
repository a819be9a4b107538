"""Test stand-in package (see moe_dispatch_combine_impl.py)."""
