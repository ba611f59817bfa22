"""Corral: a GPU cluster scheduler and orchestrator."""

from corral.native import install as _install_native

__version__ = "0.1.0"

_install_native()  # the compiled core, where it was built for these sources (corral.native)
