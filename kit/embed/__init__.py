"""Embedding models: :mod:`kit.embed.process` (the server side, no mlx) runs the model in its
own process (:mod:`kit.embed.child`, :mod:`kit.embed.model`) over :mod:`kit.embed.wire`;
:mod:`kit.server.openai_embeddings` serves it at ``/v1/embeddings`` as ``local-embed``."""
