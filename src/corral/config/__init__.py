"""Corral config layer."""
