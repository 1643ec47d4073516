"""Console entry points: ``servo-serve`` and ``servo-edge``."""
