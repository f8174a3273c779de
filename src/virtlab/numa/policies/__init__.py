"""Layout policies, one module each, registered by name in ``POLICIES``."""

from virtlab.numa.policies._base import POLICIES, Policy, PolicyParams, Situation, register_policy

__all__ = ["POLICIES", "Policy", "PolicyParams", "Situation", "register_policy"]

# The built-in policies register themselves on import.
from virtlab.numa.policies import asymsched, default, dino, reactive, simple  # noqa: E402, F401
