"""Corral sim layer."""
