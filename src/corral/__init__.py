"""Corral: a GPU cluster scheduler and orchestrator."""

__version__ = "0.1.0"
