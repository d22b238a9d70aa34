"""The decode core: :class:`~kit.engine.decode.engine.Engine` (the public API and the worker
loop), the model slot and its warm-up, prompts and their bound, sampling and constrained
decoding, the Pipeline that prepares and completes a run, and decoding alone
(``sequential``) or in a batch (``batch``); ``run``, ``inbox`` and ``bridge`` are the
records, the worker's queue and the thread -> asyncio hand-off they share.

Uses :mod:`kit.engine.cache`; knows no process or world.
"""
