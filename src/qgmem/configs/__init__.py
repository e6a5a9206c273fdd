"""The config hub: YAML presets shipped with the package, selectable by name (``--config qwen3_8b``).

``default`` is the embedded CPU setting ``python train.py`` runs (the compact prompt); ``nodes10`` the former
default (10 units of text, one graph token per node); ``qwen3_8b`` is the paper's. Retired names are refused,
saying what replaced them (:data:`qgmem.older_records.RETIRED_PRESETS`). The one
copy of each preset is the repository's ``configs/<name>.yaml``; the files here are links to it, which
setuptools resolves into real files when it builds a wheel, so an installed package ships them too.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SUFFIX = ".yaml"


def preset_names() -> list[str]:
    """The presets this package ships, without the ``.yaml`` suffix."""
    return sorted(p.name[: -len(SUFFIX)] for p in resources.files(__name__).iterdir() if p.name.endswith(SUFFIX))


def preset_path(name: str) -> Path:
    """The file of preset ``name`` (``qwen3_8b`` or ``qwen3_8b.yaml``); ``FileNotFoundError`` lists the presets."""
    from qgmem.older_records import RETIRED_PRESETS

    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    if stem in RETIRED_PRESETS:
        raise FileNotFoundError(f"preset {stem!r} was retired: {RETIRED_PRESETS[stem]}")
    if stem in preset_names():
        return Path(str(resources.files(__name__) / f"{stem}{SUFFIX}"))
    raise FileNotFoundError(f"no config file or preset named {name!r} (presets: {', '.join(preset_names())})")


def resolve_config(value: str) -> str:
    """A ``--config`` value as a path: an existing file stays as given, otherwise it names a preset."""
    if Path(value).is_file() or ("/" in value or "\\" in value):
        return value  # a path (a missing one is reported by the parser, naming it)
    return str(preset_path(value))
