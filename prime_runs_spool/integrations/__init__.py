"""Adapters that wire the run API into particular eval frameworks, one module each.

An adapter imports nothing from its framework: it is duck-typed on the framework's
config, so this package never pins (or drags in) an eval framework.
"""
