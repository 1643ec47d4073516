"""The edge runtime: control loop, inference engines, fail-safe, safety limits, recording.

Public names (imported when first used, see `servo._exports`; the control process imports only
what it runs): the runtime (`EdgeRuntime`, `RunOptions`, `RunSummary`), its configuration
(`EdgeConfig` and one section per consumer, `load_edge_config`) and the engines (`ENGINES`,
`make_engine`, the `EngineBase` loop, what `EngineBase.produce` takes and returns, and the four
engines).
"""

from typing import TYPE_CHECKING

from servo._exports import lazy_exports

if TYPE_CHECKING:
    from servo.edge.actions import ControlConfig as ControlConfig
    from servo.edge.config import EdgeConfig as EdgeConfig
    from servo.edge.config import LinkConfig as LinkConfig
    from servo.edge.config import LocalConfig as LocalConfig
    from servo.edge.config import ReplayConfig as ReplayConfig
    from servo.edge.config import SecurityConfig as SecurityConfig
    from servo.edge.config import ServerConfig as ServerConfig
    from servo.edge.config import load_edge_config as load_edge_config
    from servo.edge.engine import EngineBase as EngineBase
    from servo.edge.engines import ENGINES as ENGINES
    from servo.edge.engines import make_engine as make_engine
    from servo.edge.errors import EdgeStartError as EdgeStartError
    from servo.edge.failsafe import FailSafeConfig as FailSafeConfig
    from servo.edge.local import RtcEngine as RtcEngine
    from servo.edge.local import SyncEngine as SyncEngine
    from servo.edge.pipeline import PipelineConfig as PipelineConfig
    from servo.edge.pipeline import Produced as Produced
    from servo.edge.pipeline import Request as Request
    from servo.edge.remote import RemoteEngine as RemoteEngine
    from servo.edge.replay import ReplayEngine as ReplayEngine
    from servo.edge.runtime import EdgeRuntime as EdgeRuntime
    from servo.edge.runtime import RunOptions as RunOptions
    from servo.edge.runtime import RunSummary as RunSummary

else:  # at run time: imported when first used (type checkers read the imports above)
    __all__, __getattr__, __dir__ = lazy_exports(globals())
