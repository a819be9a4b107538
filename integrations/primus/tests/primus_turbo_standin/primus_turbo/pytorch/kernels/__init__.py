"""Primus-Turbo stand-in (see primus_turbo_standin/README.md)."""
