"""The distributed world: one model over ranks that ``mlx.launch`` starts.

``world_process`` (DistributedEngine, the process boundary over a world), ``hosts`` (the
--ranks/--hosts/--hostfile plan), ``rank`` (each rank's main), ``rank_inbox`` (rank 0's
arrivals shared at sync points), ``world`` (share/gather/agree over mx.distributed),
``world_codec`` / ``world_faults`` (the shares as typed records in signed frames),
``ring_guard`` (the world's secret and its ring links). See docs/distributed.md.
"""
