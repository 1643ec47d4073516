"""The edge runtime: control loop, inference engines, fail-safe, safety limits, recording."""
