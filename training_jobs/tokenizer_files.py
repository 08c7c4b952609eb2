"""Where a tokenizer's model file lies in the folders Kiln writes; stdlib only, so the library, the assets and the
training processes all find it the same way.

- the `tokenizer` asset's folder: `tokenizer.model` (SentencePiece, trained here or brought) or `hf_tokenizer.json`
  (a brought Hugging Face `tokenizers` file; `tokenizer.json` there is Kiln's card, hence the other name);
- a Hugging Face export folder (`hf/`): `tokenizer.model` (with HF's `tokenizer.json` built from it beside it: the
  model file comes first) or `tokenizer.json` (a brought one, under HF's own name), the card as `kiln_tokenizer.json`.

Either model file is copied byte for byte from what was trained or brought: its sha256 is the tokenizer's identity.
"""

from __future__ import annotations

from pathlib import Path

SENTENCEPIECE_FILE = "tokenizer.model"
HF_FILE = "tokenizer.json"  # Hugging Face's name for a `tokenizers` file
ASSET_HF_FILE = "hf_tokenizer.json"  # the same file in the tokenizer asset's folder
CARD_FILE = "tokenizer.json"  # Kiln's tokenizer card in the tokenizer asset's folder
EXPORT_CARD_FILE = "kiln_tokenizer.json"  # the card in a Hugging Face export folder


def model_file(path: str | Path) -> Path:
    """The tokenizer file `path` is, or the one in folder `path` (see the module docstring)."""
    path = Path(path)
    if not path.is_dir():
        return path
    for name in (SENTENCEPIECE_FILE, ASSET_HF_FILE, HF_FILE):
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(f"no tokenizer in {path} (none of {SENTENCEPIECE_FILE}, {ASSET_HF_FILE}, {HF_FILE}); "
                            f"materialize the tokenizer asset first, or point at its folder")


__all__ = ["ASSET_HF_FILE", "CARD_FILE", "EXPORT_CARD_FILE", "HF_FILE", "SENTENCEPIECE_FILE", "model_file"]
