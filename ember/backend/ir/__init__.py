"""See the package docstring of ember.backend."""
