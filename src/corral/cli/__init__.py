"""Corral cli layer."""
