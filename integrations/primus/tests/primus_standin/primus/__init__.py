"""Primus stand-in (see primus/cli/main.py)."""
