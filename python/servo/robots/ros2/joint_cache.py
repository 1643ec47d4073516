"""The newest position of every joint the policy drives, from JointState messages, and its age.

Pure bookkeeping (no DDS), so its rules are testable on their own:

* a message updates the joints it names and the others keep their value: a driver may publish
  the arm and the gripper in separate messages, in any order, with joints servo does not drive;
* a value counts from the edge's monotonic clock: the message's header stamp is the robot's ROS
  clock (simulated time, another host's wall clock) and is never compared with ours;
* a joint's value that is not a finite number is no reading (it does not refresh the joint);
* a message with fewer positions than names is malformed and ignored (and counted).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

#: Distinct name lists remembered (a hostile or buggy publisher cannot grow it without bound).
_MAX_LAYOUTS = 64

IntArray = npt.NDArray[np.intp]


class JointCache:
    """Joint positions by the robot's names, in the policy's order. Owned by the control loop's thread.

    Args:
        robot_names: The robot's joint names, in the policy's order.
        scale: Policy units per ROS unit, per joint.
    """

    def __init__(self, robot_names: Sequence[str], scale: Sequence[float]) -> None:
        self.robot_names = tuple(robot_names)
        self._index = {name: i for i, name in enumerate(self.robot_names)}
        self._scale = np.asarray(scale, dtype=np.float64)
        self._values = np.full(len(self.robot_names), np.nan)
        self._seen_ns = np.full(len(self.robot_names), -1, dtype=np.int64)
        self._layouts: dict[tuple[str, ...], tuple[IntArray, IntArray]] = {}
        #: The joint names of the newest message (start-up diagnostics).
        self.last_names: tuple[str, ...] = ()
        self.malformed = 0

    def update(self, names: Sequence[str], positions: Sequence[float], seen_ns: int) -> None:
        """Take one JointState's positions; ``seen_ns`` is when it is known to have arrived by."""
        key = tuple(names)
        if len(positions) < len(key):
            self.malformed += 1
            return
        self.last_names = key
        source, target = self._layout(key)
        if not len(source):
            return
        values = np.asarray(positions, dtype=np.float64)[source]
        fresh = np.isfinite(values)
        self._values[target[fresh]] = values[fresh]
        self._seen_ns[target[fresh]] = seen_ns

    def _layout(self, key: tuple[str, ...]) -> tuple[IntArray, IntArray]:
        layout = self._layouts.get(key)
        if layout is None:
            pairs = [(i, self._index[name]) for i, name in enumerate(key) if name in self._index]
            layout = (np.array([p[0] for p in pairs], np.intp), np.array([p[1] for p in pairs], np.intp))
            if len(self._layouts) >= _MAX_LAYOUTS:
                self._layouts.clear()
            self._layouts[key] = layout
        return layout

    def missing(self) -> list[str]:
        """Joints never seen yet."""
        return [name for name, seen in zip(self.robot_names, self._seen_ns, strict=True) if seen < 0]

    def stalest(self, now_ns: int) -> tuple[str, float]:
        """The joint seen longest ago and its age in seconds (inf if never seen)."""
        index = int(np.argmin(self._seen_ns))
        seen = int(self._seen_ns[index])
        return self.robot_names[index], (np.inf if seen < 0 else (now_ns - seen) / 1e9)

    def state(self) -> npt.NDArray[np.float32]:
        """Positions in the policy's units and order (NaN for a joint never seen)."""
        return (self._values * self._scale).astype(np.float32)
