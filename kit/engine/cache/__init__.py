"""The prompt cache and the memory it holds: KV quantization (``kv``), memory admission
(``admission``), reclaiming freed memory (``reclaim``), and the disk tier (``disk_tier``:
which file a prompt starts from and the idle-time writes; ``disk_cache``: the files;
``cache_identity``, ``cache_mac``, ``safe_files``: whose they are and whether to trust them).

Below the decode core: nothing here imports :mod:`kit.engine.decode`.
"""
