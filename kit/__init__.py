"""mlx-kit: a local MLX-backed, OpenAI-compatible LLM server and the harness machinery
that wires coding agents to it under the stable model id ``local``.

Importing this package is cheap: nothing here imports mlx or mlx-lm.
"""

__version__ = "0.1.0"

#: The stable model id every agent config names. The real model behind it can change.
STABLE_MODEL_ID = "local"

__all__ = ["STABLE_MODEL_ID", "__version__"]
