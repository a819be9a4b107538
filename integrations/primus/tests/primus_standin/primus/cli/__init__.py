"""Primus stand-in CLI."""
