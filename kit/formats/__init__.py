"""Model families' output formats: how each family writes reasoning and tool calls, and the
parser that turns that text back into reasoning, answer text and tool calls.

- :mod:`kit.formats.base`: :class:`OutputFormat`, the one description the engine's
  :class:`kit.formats.output.OutputParser` runs on, and the call-end scanners formats share.
- :mod:`kit.formats.select`: which format a model uses, from its chat template and vocab
  (pure Python and mlx-free, so the catalog can name it without loading the model).
- one module per family mlx-lm has no parser for, or whose mlx-lm parser we correct.

Selection first asks our own table (families mlx-lm lacks, and corrections), then mlx-lm's
parsers (``mlx_lm.tool_parsers``, imported only when a model is loaded).
"""

from kit.formats.base import OutputFormat
from kit.formats.select import Detected, detect, load_format

__all__ = ["Detected", "OutputFormat", "detect", "load_format"]
