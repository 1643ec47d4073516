"""Console entry points: ``servo-serve``, ``servo-edge`` and ``servo-router``."""
