"""Shared test settings and fixtures: offline hubs, small thread counts, real embedded models once.

The suite runs on two xdist workers (``pyproject.toml``), so a session fixture is built once per worker;
``once_per_run`` builds a folder once for the whole run. How to keep a new test fast: ``tests/README.md``.
"""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# as the entry points do (qgmem.omp): OpenMP threads sleep while they wait, on a CPU shared by the workers
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # the workers share the cores: one worker's torch gets its share
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
CONVOMEM_SAMPLE = REPO_ROOT / "data" / "convomem"


@pytest.fixture()
def keep_torch_threads():
    """A bench script sets torch's thread count for the whole process; later tests must not inherit it."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def hash_encoder():
    """A deterministic bag-of-words encoder (``tests/activation/helpers.py``)."""
    from activation.helpers import HashEncoder

    return HashEncoder()


@pytest.fixture()
def small_store(hash_encoder):
    """The hand-made store of ``tests/activation/helpers.py`` (activation, evaluation, reranker training)."""
    from activation.helpers import build_small_store

    return build_small_store(hash_encoder)


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory):
    """``once_per_run(name, build)``: the folder ``name``, filled by ``build(folder)`` once for the whole run.

    Every xdist worker of one run shares the folder (the run's temporary root); the first to ask builds it
    under a lock while the others wait, and a later ask returns it at once. For what many files need and
    costs seconds to make (an untrained export, a built store, a database's data folder).
    """
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(name: str, build) -> Path:
        folder = shared / "once" / name
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            done = folder / ".built"
            if not done.exists():  # never built, or a build that failed half-way: start clean
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                build(folder)
                done.touch()
        return folder

    return get


@pytest.fixture(scope="session")
def tiny_lm_path(once_per_run):
    """A random 1-layer Llama with SmolLM2's tokenizer and chat template (serving and evaluation tests)."""
    from qgmem.model.random_lm import save_random_lm
    from serving.helpers import HIDDEN

    folder = once_per_run("tiny_lm", lambda out: save_random_lm(out, hidden_size=HIDDEN, layers=1))
    return str(folder)


@pytest.fixture(scope="session")
def convomem_path() -> Path:
    """The real ConvoMem sample shipped in ``data/convomem`` (CC-BY-NC-4.0, see its SOURCE.md)."""
    return CONVOMEM_SAMPLE


@pytest.fixture(scope="session")
def sentence_encoder():
    """The real embedded MiniLM sentence encoder, loaded once per test session."""
    from qgmem.embed import SentenceEncoder

    return SentenceEncoder()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's tokenizer (loads offline from the embedded model); pairs well with tiny random LMs."""
    from qgmem.lm import EMBEDDED_LM, load_tokenizer

    return load_tokenizer(EMBEDDED_LM)
