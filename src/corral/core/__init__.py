"""Corral core layer."""
