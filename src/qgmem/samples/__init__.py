"""The offline sample build: replay construction + activation per case and keep the samples on disk.

``spec`` (settings, keys, folders) → ``build`` (plan, sharded replay, answers, filter) → ``cache`` (the
Arrow format, checksums); ``embedding_memo`` encodes each distinct text once; ``answer_filter`` and
``judge`` decide which answered samples train; ``graph_stats`` describes what the cached graphs hold.
Nothing here imports Lightning's training code: the data module (:mod:`qgmem.training.datamodule`)
asks for a cache and reads it.
"""
