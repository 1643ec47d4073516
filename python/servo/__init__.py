"""servo: serve action-chunking robot policies from GPU servers to CPU edge control loops.

Everything an application uses is here, as ``servo.X`` (the modules below it may move)::

    server = servo.PolicyServer(servo.load_manifest("manifest.toml"))        # a GPU box
    async with servo.PolicyClient.connect(settings, client_id="r7") as client: ...  # a script
    config = servo.load_edge_config("edge.toml")                              # a robot
    robot = servo.RobotDescription("sim", {})
    engine = servo.make_engine(config, robot.spec())
    summary = await servo.EdgeRuntime(robot, engine, config, servo.RunOptions()).run()

Every error servo raises is a `ServoError`, through the category that says what went wrong
(`ClientError`, `ConfigError`, `SecurityError`, `ProtocolError`, `PolicyError`, `RobotError`,
`StartError`; see `servo.errors`); each keeps its builtin base (a `ConfigError` is a ``ValueError``).

Importing ``servo`` loads none of them: each name is imported the first time it is used, so
``import servo`` stays instant, never imports torch and opens nothing.
"""

from typing import TYPE_CHECKING

from servo._core import __version__ as __version__
from servo._exports import lazy_exports

if TYPE_CHECKING:
    from servo.client import ChunkResult as ChunkResult
    from servo.client import ClientError as ClientError
    from servo.client import NoServerFound as NoServerFound
    from servo.client import PolicyClient as PolicyClient
    from servo.client import RemoteSession as RemoteSession
    from servo.client import RequestTimeout as RequestTimeout
    from servo.client import RogueServer as RogueServer
    from servo.client import SendFailed as SendFailed
    from servo.client import ServerError as ServerError
    from servo.client import ServerInfo as ServerInfo
    from servo.client import SessionLost as SessionLost
    from servo.client import SessionRejected as SessionRejected
    from servo.client import SyncPolicyClient as SyncPolicyClient
    from servo.client import TrustedServers as TrustedServers
    from servo.client import UntrustedServer as UntrustedServer
    from servo.config import ConfigError as ConfigError
    from servo.edge import ENGINES as ENGINES
    from servo.edge import ControlConfig as ControlConfig
    from servo.edge import EdgeConfig as EdgeConfig
    from servo.edge import EdgeRuntime as EdgeRuntime
    from servo.edge import EdgeStartError as EdgeStartError
    from servo.edge import EngineBase as EngineBase
    from servo.edge import FailSafeConfig as FailSafeConfig
    from servo.edge import LinkConfig as LinkConfig
    from servo.edge import LocalConfig as LocalConfig
    from servo.edge import PipelineConfig as PipelineConfig
    from servo.edge import RemoteEngine as RemoteEngine
    from servo.edge import ReplayConfig as ReplayConfig
    from servo.edge import ReplayEngine as ReplayEngine
    from servo.edge import RtcEngine as RtcEngine
    from servo.edge import RunOptions as RunOptions
    from servo.edge import RunSummary as RunSummary
    from servo.edge import SecurityConfig as SecurityConfig
    from servo.edge import ServerConfig as ServerConfig
    from servo.edge import SyncEngine as SyncEngine
    from servo.edge import load_edge_config as load_edge_config
    from servo.edge import make_engine as make_engine
    from servo.edge.failures import PolicyFailed as PolicyFailed
    from servo.edge.failures import SessionEnded as SessionEnded
    from servo.errors import PolicyError as PolicyError
    from servo.errors import ProtocolError as ProtocolError
    from servo.errors import RobotError as RobotError
    from servo.errors import SecurityError as SecurityError
    from servo.errors import ServoError as ServoError
    from servo.errors import StartError as StartError
    from servo.identity import IdentityError as IdentityError
    from servo.join import JoinTokenError as JoinTokenError
    from servo.policy import POLICIES as POLICIES
    from servo.policy import DecodedObservation as DecodedObservation
    from servo.policy import Policy as Policy
    from servo.policy import PolicyLoadError as PolicyLoadError
    from servo.policy import PolicyOutputError as PolicyOutputError
    from servo.policy import PolicySpec as PolicySpec
    from servo.policy import Processor as Processor
    from servo.policy import load_policy as load_policy
    from servo.robots import ROBOTS as ROBOTS
    from servo.robots import CalibrationError as CalibrationError
    from servo.robots import CameraError as CameraError
    from servo.robots import Cameras as Cameras
    from servo.robots import CameraSpec as CameraSpec
    from servo.robots import Robot as Robot
    from servo.robots import RobotDescription as RobotDescription
    from servo.robots import RobotFault as RobotFault
    from servo.robots import RobotParts as RobotParts
    from servo.robots import RobotSpec as RobotSpec
    from servo.robots import make_robot as make_robot
    from servo.server import Manifest as Manifest
    from servo.server import PolicyServer as PolicyServer
    from servo.server import ServerReady as ServerReady
    from servo.server import load_manifest as load_manifest
    from servo.server import parse_manifest as parse_manifest
    from servo.transport import TlsSettings as TlsSettings
    from servo.transport import ZenohSettings as ZenohSettings
    from servo.wire import CameraFeature as CameraFeature
    from servo.wire import Features as Features
    from servo.wire import WireError as WireError

else:  # at run time: imported when first used (type checkers read the imports above)
    __all__, __getattr__, __dir__ = lazy_exports(globals())
    __all__.insert(0, "__version__")
