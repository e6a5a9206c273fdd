"""The export format: save/load (folder and hub id), push_to_hub, model card metadata, refused exports."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import HfApi, ModelCard

from qgmem.errors import IntegrityError
from qgmem.model.pretrained import (ADAPTER_DIR, CONFIG_FILE, FORMAT_VERSION, WEIGHTS_FILE, ExportFormatError,
                                    GraphTokenEncoder, HiddenSizeMismatch)
from qgmem.training.datamodule import synthetic_items

from .helpers import HIDDEN, make_encoder, make_export


def test_round_trip_gives_the_same_graph_tokens(tiny_lm_path, tmp_path):
    encoder = make_encoder(tiny_lm_path)
    encoder.save_pretrained(tmp_path / "export")
    assert {p.name for p in (tmp_path / "export").iterdir()} == {WEIGHTS_FILE, CONFIG_FILE, "README.md",
                                                                      "checksums.json"}
    loaded = GraphTokenEncoder.from_pretrained(tmp_path / "export")
    graphs = [it["graph"] for it in synthetic_items(3, 8, seed=4)]
    tokens = loaded.encode(graphs)
    assert tokens.shape == (3, 1, HIDDEN) and not tokens.requires_grad  # K = 1 token per graph (mean readout)
    torch.testing.assert_close(tokens, encoder.encode(graphs))
    config = json.loads((tmp_path / "export" / CONFIG_FILE).read_text())
    assert config["format_version"] == FORMAT_VERSION and config["lm"]["id"] == tiny_lm_path
    assert loaded.adapter_dir is None


def test_hub_id_is_served_from_the_hub_cache(tiny_lm_path, tmp_path):
    """A hub id resolves through huggingface_hub; offline, the cached snapshot serves it."""
    snapshot = tmp_path / "hub" / "models--someone--qgmem-export" / "snapshots" / ("a" * 40)
    make_export(snapshot, tiny_lm_path)
    (tmp_path / "hub" / "models--someone--qgmem-export" / "refs").mkdir()
    (tmp_path / "hub" / "models--someone--qgmem-export" / "refs" / "main").write_text("a" * 40)
    loaded = GraphTokenEncoder.from_pretrained("someone/qgmem-export", cache_dir=tmp_path / "hub")
    assert loaded.config.lm_hidden == HIDDEN and loaded.source == str(snapshot)
    with pytest.raises(FileNotFoundError, match="'someone/missing': not a local folder"):
        GraphTokenEncoder.from_pretrained("someone/missing", cache_dir=tmp_path / "hub")


def test_push_to_hub_uploads_the_export_folder(tiny_lm_path, monkeypatch):
    pushed = {}

    def create_repo(self, repo_id, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        pushed["repo"] = repo_id
        pushed["files"] = sorted(p.name for p in folder_path.iterdir())
        pushed["card"] = ModelCard.load(folder_path / "README.md").data.to_dict()
        return "https://hub.example/commit/1"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    assert make_encoder(tiny_lm_path).push_to_hub("someone/qgmem-export") == "https://hub.example/commit/1"
    assert pushed["repo"] == "someone/qgmem-export" and pushed["files"] == ["README.md", "checksums.json", CONFIG_FILE,
                                                                                   WEIGHTS_FILE]
    assert pushed["card"]["license"] == "cc-by-nc-4.0"


@pytest.mark.parametrize("dataset,licence,hub_dataset", [("convomem", "cc-by-nc-4.0", "Salesforce/ConvoMem"),
                                                         ("longmemeval", "mit", "xiaowu0162/longmemeval"),
                                                         ("custom", None, None)])
def test_model_card_metadata(tiny_lm_path, tmp_path, dataset, licence, hub_dataset):
    make_export(tmp_path, tiny_lm_path, dataset=dataset)
    card = ModelCard.load(tmp_path / "README.md")
    data = card.data.to_dict()
    assert data.get("license") == licence and data.get("datasets") == ([hub_dataset] if hub_dataset else None)
    assert data["library_name"] == "qgmem" and data.get("base_model") is None  # a local LM folder is no hub model
    results = data["model-index"][0]["results"]
    assert [(m["type"], m["value"]) for r in results for m in r["metrics"]] == [("em", 0.25), ("f1", 0.5)]
    assert "| val | nll | 2.5000 |" in card.text and "| test | f1 | 0.5000 |" in card.text


def test_model_card_without_metrics_says_so(tiny_lm_path, tmp_path):
    make_export(tmp_path, tiny_lm_path, metrics=None)
    card = ModelCard.load(tmp_path / "README.md")
    assert "model-index" not in card.data.to_dict() and "No metrics were recorded" in card.text


def _edit_config(folder, edit):
    config = json.loads((folder / CONFIG_FILE).read_text())
    edit(config)
    (folder / CONFIG_FILE).write_text(json.dumps(config))


@pytest.mark.parametrize("edit,message", [
    (lambda c: c["graph_token"]["encoder"].update(hidden=32, heads=2),
     r"config field graph_token\.encoder\.hidden = 32 disagrees with the weights: 'encoder.input.weight' has size 16"),
    (lambda c: c["graph_token"]["encoder"].update(layers=3),
     r"config field graph_token\.encoder\.layers = 3 disagrees with the weights, which have 2 'encoder.convs\.\*' layers"),
    (lambda c: c["graph_token"].update(feature_dim=12),
     r"config field graph_token\.feature_dim = 12 disagrees with the weights: 'encoder.input.weight' has size 8"),
    (lambda c: c.update(format_version=99), r"field 'format_version' is 99; this qgmem reads versions \[1, 2, 3, 4, 5\]"),
    (lambda c: c.update(format="other"), r"field 'format' is 'other'"),
])
def test_mismatched_export_is_refused_by_name(tiny_lm_path, tmp_path, edit, message):
    folder = make_export(tmp_path / "export", tiny_lm_path)
    _edit_config(folder, edit)
    with pytest.raises(ExportFormatError, match=message):
        GraphTokenEncoder.from_pretrained(folder)


def test_hidden_size_of_the_serving_lm_is_checked(tiny_lm_path, tmp_path):
    folder = make_export(tmp_path, tiny_lm_path)
    with pytest.raises(HiddenSizeMismatch, match="field 'graph_token.lm_hidden' is 32 .* hidden size 576"):
        GraphTokenEncoder.from_pretrained(folder, expected_hidden_size=576)


@pytest.mark.parametrize("layout", ["empty", "file", "no-weights"])
def test_not_an_export(tiny_lm_path, tmp_path, layout):
    if layout == "file":
        target = tmp_path / "x.json"
        target.write_text("{}")
        match = "is a file"
    elif layout == "empty":
        target, match = tmp_path, "config.json is missing"
    else:
        target = make_export(tmp_path / "export", tiny_lm_path)
        (target / WEIGHTS_FILE).unlink()
        match = "graph_encoder.safetensors is missing"
    with pytest.raises(FileNotFoundError, match=match):
        GraphTokenEncoder.from_pretrained(target)


def test_version_1_export_with_lora_is_refused(tiny_lm_path, tmp_path):
    folder = make_export(tmp_path / "export", tiny_lm_path)
    _edit_config(folder, lambda c: c.update(format_version=1, lora={"r": 2}))
    with pytest.raises(ExportFormatError, match="version-1 export keeps its LoRA adapter outside PEFT's format"):
        GraphTokenEncoder.from_pretrained(folder)
    assert not (folder / ADAPTER_DIR).exists()


# --- damaged exports: flipped, truncated, damaged header, NaN, missing checksums ---------------------

def _flip(path, offset=None, n=32):
    data = bytearray(path.read_bytes())
    start = len(data) // 2 if offset is None else offset
    for i in range(start, start + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_in_the_weights_are_refused_naming_the_file(tiny_lm_path, tmp_path):
    folder = make_export(tmp_path / "export", tiny_lm_path)
    _flip(folder / WEIGHTS_FILE)  # was: loaded silently, weights up to 4,720 in magnitude
    with pytest.raises(IntegrityError) as err:
        GraphTokenEncoder.from_pretrained(folder)
    assert f"{folder / WEIGHTS_FILE}: checksum mismatch" in str(err.value) and "qgmem export" in str(err.value)


@pytest.mark.parametrize("sealed", [True, False])
def test_truncated_or_garbled_weights_name_the_file(tiny_lm_path, tmp_path, sealed):
    folder = make_export(tmp_path / "export", tiny_lm_path)
    weights = folder / WEIGHTS_FILE
    if sealed:  # cut short: the size check says so before anything is parsed
        weights.write_bytes(weights.read_bytes()[:100])
        match = r"graph_encoder\.safetensors: truncated \(100 bytes"
    else:  # a version-2 export has no checksums: a damaged header must still name the file, not raise SafetensorError
        _edit_config(folder, lambda c: c.update(format_version=2))
        (folder / "checksums.json").unlink()
        _flip(weights, offset=8, n=16)
        match = r"graph_encoder\.safetensors: unreadable safetensors file"
    with pytest.raises(IntegrityError, match=match) as err:
        GraphTokenEncoder.from_pretrained(folder)
    assert "qgmem export" in str(err.value)


def test_a_nan_tensor_is_refused_at_load_naming_it(tiny_lm_path, tmp_path):
    from safetensors.torch import load_file, save_file

    from qgmem.integrity import seal

    folder = make_export(tmp_path / "export", tiny_lm_path)
    state = load_file(str(folder / WEIGHTS_FILE))
    name = sorted(state)[1]
    state[name] = state[name].clone()
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(folder / WEIGHTS_FILE))
    seal(folder, [WEIGHTS_FILE])  # checksums that match: only the finiteness check can catch it
    with pytest.raises(IntegrityError, match=rf"1 of {len(state)} weight tensors hold NaN or inf \({name}\)"):
        GraphTokenEncoder.from_pretrained(folder)  # was: loaded, and every answer was ""


def test_a_version_3_export_without_checksums_is_refused(tiny_lm_path, tmp_path):
    folder = make_export(tmp_path / "export", tiny_lm_path)
    (folder / "checksums.json").unlink()
    with pytest.raises(IntegrityError, match=r"checksums.json: is missing, so .* cannot be verified .*qgmem export"):
        GraphTokenEncoder.from_pretrained(folder)


def test_a_version_2_export_loads_unverified_with_a_warning(tiny_lm_path, tmp_path, caplog):
    folder = make_export(tmp_path / "export", tiny_lm_path)
    (folder / "checksums.json").unlink()
    _edit_config(folder, lambda c: c.update(format_version=2))
    with caplog.at_level("WARNING", logger="qgmem.model"):
        assert GraphTokenEncoder.from_pretrained(folder).config.lm_hidden == HIDDEN
    assert "carries no checksums and is loaded unverified" in caplog.text


def test_a_version_3_export_with_the_old_names_of_k_loads_the_same(tiny_lm_path, tmp_path):
    """Version 3 named K ``num_queries`` (network) and ``graph_tokens`` (prompt, readout); it still loads."""
    from qgmem.model.encoder import EncoderConfig
    from qgmem.model.graph_token import GraphTokenConfig
    from qgmem.prompting import PromptSettings

    from .helpers import export_config

    torch.manual_seed(0)
    net = GraphTokenConfig(feature_dim=8, edge_dim=8, lm_hidden=HIDDEN, features="text", readout="nodes",
                           num_graph_tokens=3, encoder=EncoderConfig(hidden=16, heads=2, layers=1, dropout=0.0))
    encoder = GraphTokenEncoder(net, export_config(tiny_lm_path, 8, prompt=PromptSettings(num_graph_tokens=3).to_dict(),
                                                   readout={"kind": "nodes", "num_graph_tokens": 3})).eval()
    folder = tmp_path / "export"
    encoder.save_pretrained(folder)

    def to_v3(c):
        c["format_version"] = 3
        c["graph_token"]["num_queries"] = c["graph_token"].pop("num_graph_tokens")
        answer = c.pop("answer")  # version 3 kept the answer contract's parts at the top level
        c.update(prompt=answer["prompt"], activation=answer["activation"], graph_mode=answer["graph_mode"])
        c["prompt"]["graph_tokens"] = c["prompt"].pop("num_graph_tokens")
        c["readout"] = {"kind": "nodes", "graph_tokens": 3}

    _edit_config(folder, to_v3)
    assert "num_queries" in (folder / CONFIG_FILE).read_text()
    loaded = GraphTokenEncoder.from_pretrained(folder)
    assert loaded.config.num_graph_tokens == 3 and loaded.config.readout == "nodes"
    assert loaded.export_config["readout"] == {"kind": "nodes", "num_graph_tokens": 3}
    assert PromptSettings.from_dict(loaded.export_config["answer"]["prompt"]).num_graph_tokens == 3
    assert "prompt" not in loaded.export_config and loaded.export_config["answer"]["graph_mode"] == "token"
    graphs = [it["graph"] for it in synthetic_items(2, 8, seed=1)]
    torch.testing.assert_close(loaded.encode(graphs), encoder.encode(graphs))


def test_answer_command_on_a_damaged_export_exits_2_naming_the_file(tiny_lm_path, tmp_path, capsys):
    from qgmem.cli import main

    folder = make_export(tmp_path / "export", tiny_lm_path)
    _flip(folder / WEIGHTS_FILE)
    history = tmp_path / "h.json"
    history.write_text(json.dumps([[{"speaker": "user", "text": "I like green."}]]))
    assert main(["answer", "--export", str(folder), "--history", str(history), "--question", "Which?"]) == 2
    err = capsys.readouterr().err
    assert "graph_encoder.safetensors: checksum mismatch" in err and "Traceback" not in err


def test_the_weights_are_written_readable_like_their_neighbours(tiny_lm_path, tmp_path):
    """Was 0600 (safetensors writes through a private temp file) beside a 0644 config.json: a service
    account other than the builder could not read the export."""
    import os

    folder = make_export(tmp_path / "export", tiny_lm_path)
    config_mode = os.stat(folder / CONFIG_FILE).st_mode & 0o777
    assert os.stat(folder / WEIGHTS_FILE).st_mode & 0o777 == config_mode
    assert config_mode & 0o044 == 0o044 or os.umask(os.umask(0)) & 0o044  # readable unless the umask says no
