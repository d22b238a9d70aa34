"""Harness machinery: load an agent's spec -> render its templates -> plan every file's
change with the proof that allows it (:mod:`kit.harness.plan`; for removal
:mod:`kit.harness.plan_remove`; the ownership rules in :mod:`kit.harness.proof`) -> apply
it (:mod:`kit.harness.apply`: backups and receipts, atomic writes, the manifest).
``remove`` goes the same way: by the manifest's record when it is trusted, else by what
the markers and backups prove ours. ``--dry-run`` prints the plan.

Agents are data: ``harnesses/<agent>.toml`` + ``templates/<agent>/*.j2``. Adding an agent
adds those two files and touches no code here.
"""

from kit.harness.spec import HarnessSpec
from kit.harness.spec_loader import all_specs, load_spec

__all__ = ["HarnessSpec", "all_specs", "load_spec"]
