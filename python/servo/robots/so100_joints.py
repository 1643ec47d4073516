"""Joint table of the SO-100 and SO-101 follower arms, shared by the real driver and the simulator.

Names, order and units follow LeRobot's ``so100_follower`` / ``so101_follower`` with
``use_degrees=True``: the five arm joints are in degrees, 0 at the middle of each joint's
calibrated range; the gripper is in percent of its calibrated range (0 closed .. 100 open).
"""

from __future__ import annotations

from typing import Final

MOTOR_NAMES: Final = (
    "shoulder_pan",
    "shoulder_lift",
    "elbow_flex",
    "wrist_flex",
    "wrist_roll",
    "gripper",
)
"""Motor names in LeRobot's order; the bus ids are 1..6 in this order."""

MOTOR_IDS: Final = (1, 2, 3, 4, 5, 6)

JOINT_NAMES: Final = tuple(f"{name}.pos" for name in MOTOR_NAMES)
"""Feature names of the state and action vectors."""

GRIPPER_INDEX: Final = 5

UNITS_DEGREES: Final = ("degrees",) * 5 + ("range_0_100",)
"""Units with ``use_degrees=True`` (LeRobot's ``MotorNormMode`` names)."""

# Typical calibrated ranges of an assembled SO-100 (the 3D-printed parts, not the servo, set
# them). The real driver takes its limits from the calibration file instead.
LOWER: Final = (-110.0, -100.0, -100.0, -95.0, -160.0, 0.0)
UPPER: Final = (110.0, 100.0, 100.0, 95.0, 160.0, 100.0)

# STS3215 at 7.4 V turns at ~0.22 s/60 deg (~270 deg/s) unloaded; these leave headroom for load.
# The gripper is in percent of its range per second.
MAX_VELOCITY: Final = (150.0, 150.0, 150.0, 200.0, 250.0, 300.0)

# Folded arm: upper arm laid back, forearm folded over it, gripper nearly closed.
REST_POSE: Final = (0.0, -95.0, 95.0, 65.0, 0.0, 5.0)
