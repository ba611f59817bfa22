"""Corral policies layer."""
