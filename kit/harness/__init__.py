"""Harness machinery: load an agent's spec -> render its templates -> write (drop-in) ->
record in the manifest (and a receipt beside the backups); ``remove`` reverses exactly what
the manifest recorded, or, with no manifest record to trust, what the markers and backups
prove ours (:mod:`kit.harness.recover`).

Agents are data: ``harnesses/<agent>.toml`` + ``templates/<agent>/*.j2``. Adding an agent
adds those two files and touches no code here.
"""

from kit.harness.spec import HarnessSpec, all_specs, load_spec

__all__ = ["HarnessSpec", "all_specs", "load_spec"]
