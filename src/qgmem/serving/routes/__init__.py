"""The HTTP routes of ``qgmem serve``, one router per concern, each a thin layer over
:class:`~qgmem.serving.server.MemoryService`: ``users`` (a user's memory: sessions, answers, search,
memories, deletion), ``chat`` (the OpenAI-compatible surface) and ``operations`` (health, metrics).
:mod:`~qgmem.serving.routes.common` holds what they share: the bounded body read, the user-id check,
the error shape and the way a question reaches the batcher.

The router modules do not use ``from __future__ import annotations``: FastAPI reads each handler's
annotations (``request: Request``) at registration, and ``Request`` is imported inside the function that
builds the router, where a string annotation could not be resolved."""
