"""Cheap camera-like rendering of the simulated SO-100 arm.

The scene is a fixed background (a lit wooden table and a wall, with a little deterministic
texture so JPEG sizes look like a real camera's) rendered once per camera, plus the arm drawn
each frame as shaded capsules from a pinhole projection of its forward kinematics, with a soft
shadow on the table. Everything per frame is vectorised numpy confined to the links' bounding
boxes, a few milliseconds at 480x640.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .protocol import Frame

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

# Link lengths in metres, close to the SO-ARM100 print.
_SHOULDER_HEIGHT = 0.10
_UPPER_ARM = 0.116
_FOREARM = 0.135
_WRIST = 0.06
_JAW = 0.07
_JAW_MAX_OPEN_RAD = math.radians(50.0)

_ORANGE = (235.0, 140.0, 40.0)
_SERVO = (45.0, 45.0, 50.0)
_DARK = (60.0, 60.0, 66.0)
# (from point, to point, radius m, colour); point indices into `forward_kinematics`' output.
_LINKS: tuple[tuple[int, int, float, tuple[float, float, float]], ...] = (
    (0, 1, 0.045, _DARK),
    (1, 2, 0.020, _ORANGE),
    (2, 3, 0.018, _ORANGE),
    (3, 4, 0.016, _SERVO),
    (4, 5, 0.008, _SERVO),
    (4, 6, 0.008, _ORANGE),
    (1, 1, 0.028, _SERVO),
    (2, 2, 0.024, _SERVO),
    (3, 3, 0.021, _SERVO),
)
# Joint spheres sit inside their links' shadows, so only the links cast one.
_SHADOW_LINKS = 6
_SHADOW_KEEP = np.float32(0.62)
_LUT_SIZE = 64
_LIGHT = np.array([0.35, -0.45, 1.6])
_NEAR_M = 0.03


@dataclass(frozen=True)
class View:
    """A pinhole camera pose: from ``eye`` towards ``target`` (metres, z up). Immutable."""

    eye: tuple[float, float, float]
    target: tuple[float, float, float]
    hfov_deg: float = 68.0


VIEWS: dict[str, View] = {
    "front": View(eye=(0.62, 0.0, 0.34), target=(0.12, 0.0, 0.12)),
    # Not an eye-in-hand view: a close side view that keeps the gripper large in the frame.
    "wrist": View(eye=(0.30, 0.50, 0.42), target=(0.15, 0.0, 0.10), hfov_deg=60.0),
    "top": View(eye=(0.15, 0.01, 0.85), target=(0.15, 0.0, 0.0), hfov_deg=60.0),
    "side": View(eye=(0.15, -0.60, 0.25), target=(0.12, 0.0, 0.14)),
}


def view_for(name: str, index: int) -> View:
    """View for a camera called ``name``; unknown names cycle through the presets by index."""
    if name in VIEWS:
        return VIEWS[name]
    presets = list(VIEWS.values())
    return presets[index % len(presets)]


def forward_kinematics(q_deg: npt.ArrayLike) -> F64:
    """Key points of the arm for a joint vector in LeRobot units.

    Returns:
        Array (7, 3): base, shoulder, elbow, wrist, gripper palm, fixed jaw tip, moving jaw tip.
    """
    q = np.asarray(q_deg, dtype=np.float64)
    pan, lift, elbow, flex, roll = np.radians(q[:5])
    opening = float(np.clip(q[5], 0.0, 100.0)) / 100.0 * _JAW_MAX_OPEN_RAD
    # Angles in the arm's vertical plane, measured from straight up, positive leaning forward.
    a_upper = lift
    a_fore = a_upper + math.pi / 2 + elbow
    a_wrist = a_fore + flex
    fwd = np.array([math.cos(pan), math.sin(pan), 0.0])
    up = np.array([0.0, 0.0, 1.0])

    def along(angle: float) -> F64:
        return math.sin(angle) * fwd + math.cos(angle) * up

    base = np.zeros(3)
    shoulder = up * _SHOULDER_HEIGHT
    elbow_p = shoulder + _UPPER_ARM * along(a_upper)
    wrist_p = elbow_p + _FOREARM * along(a_fore)
    axis = along(a_wrist)
    palm = wrist_p + _WRIST * axis
    side = np.array([-math.sin(pan), math.cos(pan), 0.0])
    ortho = np.cross(axis, side)
    open_dir = math.cos(roll) * side + math.sin(roll) * ortho
    fixed_tip = palm + _JAW * axis + 0.012 * open_dir
    moving_tip = palm + _JAW * (math.cos(opening) * axis - math.sin(opening) * open_dir)
    return np.stack([base, shoulder, elbow_p, wrist_p, palm, fixed_tip, moving_tip])


class ArmRenderer:
    """Renders RGB frames of the arm for one camera.

    Built by the control-loop thread during connect, then used only by that camera's capture
    thread. The background is computed once and shared read-only; every `render` call returns a
    fresh array.
    """

    def __init__(self, height: int, width: int, view: View, seed: int = 0) -> None:
        """Precompute the projection and the static background.

        Args:
            height: Frame height in pixels.
            width: Frame width in pixels.
            view: Camera pose.
            seed: Seed of the background texture (deterministic per seed).
        """
        self.height = height
        self.width = width
        eye = np.asarray(view.eye, dtype=np.float64)
        fwd = np.asarray(view.target, dtype=np.float64) - eye
        fwd /= np.linalg.norm(fwd)
        right = np.cross(fwd, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        self._eye = eye
        self._basis = np.stack([right, np.cross(right, fwd), fwd])
        self._focal = (width / 2) / math.tan(math.radians(view.hfov_deg) / 2)
        self._center = np.array([(width - 1) / 2, (height - 1) / 2])
        self._xs = np.arange(width, dtype=np.float32)
        self._ys = np.arange(height, dtype=np.float32)[:, None]
        self._background = _background(eye, self._basis, self._focal, height, width, seed)
        self._background.flags.writeable = False

    def project(self, points: F64) -> tuple[F64, F64]:
        """Pixel coordinates (N, 2) and depths (N,) of world points (N, 3)."""
        cam = (points - self._eye) @ self._basis.T
        depth = np.maximum(cam[:, 2], 1e-3)
        uv = np.empty((len(points), 2))
        uv[:, 0] = self._center[0] + self._focal * cam[:, 0] / depth
        uv[:, 1] = self._center[1] - self._focal * cam[:, 1] / depth
        return uv, depth

    def render(self, q: npt.ArrayLike) -> Frame:
        """A new (height, width, 3) uint8 RGB frame of the arm at joint vector ``q``."""
        frame = self._background.copy()
        points = forward_kinematics(q)
        light_z = _LIGHT[2]
        shadow = _LIGHT + (points - _LIGHT) * (light_z / (light_z - points[:, 2:3]))
        uv_s, depth_s = self.project(shadow)
        for i, j, radius, _ in _LINKS[:_SHADOW_LINKS]:
            if min(depth_s[i], depth_s[j]) < _NEAR_M:
                continue
            r = self._focal * radius / (0.5 * (depth_s[i] + depth_s[j]))
            self._capsule(frame, uv_s[i], uv_s[j], r * 1.15, None)
        uv, depth = self.project(points)
        # Painter's algorithm: far links first. A link reaching behind the near plane would
        # project to nonsense, so it is left out, as a real lens would lose it out of focus.
        order = sorted(_LINKS, key=lambda link: -(depth[link[0]] + depth[link[1]]))
        for i, j, radius, colour in order:
            if min(depth[i], depth[j]) < _NEAR_M:
                continue
            r = self._focal * radius / (0.5 * (depth[i] + depth[j]))
            self._capsule(frame, uv[i], uv[j], r, colour)
        return frame

    def _capsule(
        self,
        frame: Frame,
        p0: F64,
        p1: F64,
        radius: float,
        colour: tuple[float, float, float] | None,
    ) -> None:
        if radius < 0.5:
            return
        pad = radius + 1.5
        y_lo = max(int(min(p0[1], p1[1]) - pad), 0)
        y_hi = min(int(max(p0[1], p1[1]) + pad) + 1, self.height)
        seg = p1 - p0
        # A long diagonal link fills little of its bounding box, so its box is cut into a few
        # horizontal bands, each narrowed to the x-span the capsule can reach within it. Bands
        # do not overlap, so no shadow pixel is darkened twice by one link. Every band costs a
        # fixed few tens of microseconds of numpy call overhead, hence only a few, tall ones.
        band = max(y_hi - y_lo, 1)
        if abs(seg[0]) > 4 * radius and abs(seg[1]) > 4 * radius:
            band = max(band // 3 + 1, 48)
        for ya in range(y_lo, y_hi, band):
            yb = min(ya + band, y_hi)
            ta, tb = 0.0, 1.0
            if abs(seg[1]) > 1e-9:
                ta = (ya - pad - p0[1]) / seg[1]
                tb = (yb + pad - p0[1]) / seg[1]
                ta, tb = max(min(ta, tb), 0.0), min(max(ta, tb), 1.0)
                if ta > tb:
                    continue
            xa = p0[0] + seg[0] * ta
            xb = p0[0] + seg[0] * tb
            x0 = max(int(min(xa, xb) - pad), 0)
            x1 = min(int(max(xa, xb) + pad) + 1, self.width)
            if x0 < x1:
                self._capsule_box(frame[ya:yb, x0:x1], x0, ya, p0, seg, radius, colour)

    def _capsule_box(
        self,
        region: Frame,
        x0: int,
        y0: int,
        p0: F64,
        seg64: F64,
        radius: float,
        colour: tuple[float, float, float] | None,
    ) -> None:
        h, w = region.shape[:2]
        f32 = np.float32
        dx = self._xs[x0 : x0 + w] - f32(p0[0])
        dy = self._ys[y0 : y0 + h] - f32(p0[1])
        sx, sy = f32(seg64[0]), f32(seg64[1])
        seg_len2 = float(sx * sx + sy * sy)
        if seg_len2 > 1e-6:
            t = dx * (sx / f32(seg_len2)) + dy * (sy / f32(seg_len2))
            np.maximum(t, f32(0.0), out=t)
            np.minimum(t, f32(1.0), out=t)
            qx = dx - t * sx
            qy = dy - t * sy
            # Signed offset across the link, in radii: what the cylinder's shading depends on.
            across = qx * (sy / f32(math.sqrt(seg_len2) * radius))
            across -= qy * (sx / f32(math.sqrt(seg_len2) * radius))
        else:
            qx = np.broadcast_to(dx, (h, w))
            qy = np.broadcast_to(dy, (h, w))
            across = qy * f32(1.0 / radius)
        dist2 = qx * qx
        dist2 += qy * qy
        inside = dist2 < f32(radius * radius)
        if colour is None:
            # Darken the table under the link; a flat shadow is enough once the light is soft.
            np.multiply(region, _SHADOW_KEEP, out=region, where=inside[..., None], casting="unsafe")
            return
        across += f32(1.0)
        across *= f32((_LUT_SIZE - 1) / 2)
        index = across.astype(np.intp)
        np.clip(index, 0, _LUT_SIZE - 1, out=index)
        np.copyto(region, _shading_lut(colour)[index], where=inside[..., None])


@functools.cache
def _shading_lut(colour: tuple[float, float, float]) -> Frame:
    # Colour of a lit cylinder across its width: Lambert term from the surface normal plus a
    # narrow highlight above the axis (a lamp over the camera), darkening towards the rim.
    across = np.linspace(-1.0, 1.0, _LUT_SIZE)
    normal_z = np.sqrt(np.clip(1.0 - across * across, 0.0, 1.0))
    shade = 0.25 + 0.75 * normal_z
    glint = np.clip(1.0 - np.abs(across - 0.35) * 3.0, 0.0, 1.0) ** 2 * 60.0
    lut = np.asarray(colour)[None, :] * shade[:, None] + glint[:, None]
    out = np.clip(lut, 0.0, 255.0).astype(np.uint8)
    out.flags.writeable = False
    return out


def _background(eye: F64, basis: F64, focal: float, height: int, width: int, seed: int) -> Frame:
    rng = np.random.default_rng(seed)
    xs = (np.arange(width) - (width - 1) / 2) / focal
    ys = ((height - 1) / 2 - np.arange(height)) / focal
    rays = (
        basis[2][None, None, :]
        + xs[None, :, None] * basis[0][None, None, :]
        + ys[:, None, None] * basis[1][None, None, :]
    )
    rays /= np.linalg.norm(rays, axis=2, keepdims=True)
    dz = rays[..., 2]
    hits_table = dz < -1e-3
    t = np.where(hits_table, -eye[2] / np.where(hits_table, dz, -1.0), 0.0)
    hx = eye[0] + t * rays[..., 0]
    hy = eye[1] + t * rays[..., 1]
    distance = np.where(hits_table, t, 10.0)

    # Wall: cool grey-blue that warms towards the horizon, faint vertical panels.
    elevation = np.clip(dz, -0.2, 0.8)[..., None]
    wall_top = np.array([104.0, 130.0, 178.0])
    wall_low = np.array([172.0, 181.0, 196.0])
    wall = wall_low + (wall_top - wall_low) * (elevation + 0.2)
    azimuth = np.arctan2(rays[..., 1], rays[..., 0])
    wall *= (0.97 + 0.03 * np.sign(np.sin(azimuth * 40.0)))[..., None]

    # Table: wooden planks along x, each plank its own tone, with grain and a lamp pool.
    plank = np.floor(hy / 0.09).astype(np.int64)
    tones = rng.uniform(0.82, 1.08, size=64)
    phases = rng.uniform(0.0, 2 * np.pi, size=64)
    tone = tones[plank % 64]
    phase = phases[plank % 64]
    # Grain lines run along the plank and wander slowly across it.
    grain = np.sin(hy * 260.0 + np.sin(hx * 9.0 + phase) * 2.5 + phase)
    seam = np.abs(hy / 0.09 - np.round(hy / 0.09)) < 0.03
    wood = np.array([170.0, 118.0, 72.0])[None, None, :] * (tone * (0.93 + 0.07 * grain))[..., None]
    wood = np.where(seam[..., None], wood * 0.7, wood)
    pool = np.exp(-((hx - _LIGHT[0] + 0.2) ** 2 + (hy - _LIGHT[1] * 0.3) ** 2) / 0.35)
    wood *= (0.62 + 0.45 * pool)[..., None]
    fog = np.clip((distance - 1.2) / 2.0, 0.0, 1.0)[..., None]
    table = wood * (1.0 - fog) + wall_low * 0.8 * fog

    image = np.where(hits_table[..., None], table, wall)
    # Vignetting and a little sensor grain, fixed per seed so frames stay comparable.
    ny = np.linspace(-1.0, 1.0, height)[:, None]
    nx = np.linspace(-1.0, 1.0, width)[None, :]
    image *= (1.0 - 0.18 * (nx * nx + ny * ny))[..., None]
    image += rng.normal(0.0, 1.6, size=image.shape)
    frame: Frame = np.clip(image, 0.0, 255.0).astype(np.uint8)
    return frame
