"""Policy adapters: the contract, the reference policy, the loader and the inference runner.

Importing this package does not import torch; the reference policy and the runner import it
when they are used.
"""

from servo.policy.errors import PolicyLoadError, PolicyOutputError
from servo.policy.loader import POLICIES, load_policy
from servo.policy.protocol import BatchingPolicy, DecodedObservation, Policy, PolicySpec, Prepared, Processor

__all__ = [
    "POLICIES",
    "BatchingPolicy",
    "DecodedObservation",
    "Policy",
    "PolicyLoadError",
    "PolicyOutputError",
    "PolicySpec",
    "Prepared",
    "Processor",
    "load_policy",
]
