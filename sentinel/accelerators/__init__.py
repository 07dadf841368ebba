"""Accelerators."""
