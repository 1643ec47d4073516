"""servo: serve action-chunking robot policies from GPU servers to CPU edge control loops."""

from servo._core import __version__ as __version__
