"""`ragserve-index tune-generator`: the data made through Query's own path, a tiny model trained in
seconds (loss falls, the adapter loads), the merge at set-up and a mismatched base refused."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from indexer.tune.generator_figures import exact_match, holds_gold, is_decline
from ragserve.config import GeneratorSettings, default_generator_path
from ragserve.errors import ConfigError
from ragserve.request.policy import ABSTAIN_ANSWER
from tests.indexer.test_tune_reader import write_squad


def _prepared_model() -> Path:
    model = default_generator_path()
    if not (model / "tokenizer.json").is_file():
        pytest.skip("the generator is not prepared (ragserve prepare-models)")
    return model


def test_figures_read_cited_answers_and_the_exact_decline() -> None:
    assert holds_gold("Alexander Fleming [1]", ["Alexander Fleming"])
    assert exact_match("Alexander Fleming [1]", ["alexander fleming."])
    assert not exact_match("It was Alexander Fleming [1]", ["Alexander Fleming"])
    assert is_decline(f"{ABSTAIN_ANSWER}", ABSTAIN_ANSWER)
    assert not is_decline("The documents do not say, but it was 1928 [1]", ABSTAIN_ANSWER)


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_examples_are_the_prompts_query_serves(tmp_path: Path) -> None:
    """Retrieved, fitted and rendered as Query does: the gold span with its passage's number, the
    decline sentence for an unanswerable question, and the gold paragraph left out of 'excluded'."""
    from indexer.tune.generator_data import DataOptions, prepare_generator_data
    from indexer.tune.generator_model import read_dataset
    from ragserve.generate.rendering import ChatRenderer

    model = _prepared_model()
    manifest = prepare_generator_data(
        write_squad(tmp_path / "squad"), str(model), tmp_path / "data", DataOptions(heldout_share=0.0), progress=False
    )
    rows, data = read_dataset(tmp_path / "data")
    assert data == manifest and manifest["decline"] == ABSTAIN_ANSWER
    renderer = ChatRenderer(str(model))
    renderer.load()
    text = {
        (r["qid"], r["kind"]): (renderer.tokenizer.decode(r["prompt"]), renderer.tokenizer.decode(r["target"]))
        for r in rows
    }
    prompt, target = text[("q1", "answer")]
    assert (
        prompt.startswith("<|im_start|>system\nYou answer questions")
        and "Question: Who discovered penicillin?" in prompt
    )
    number = int(target.split("[")[1].split("]")[0])
    assert target == f"Alexander Fleming [{number}]<|im_end|>"
    assert f'<passage id="{number}" title="Penicillin">\nPenicillin was discovered in 1928' in prompt
    assert text[("q5", "impossible")][1] == f"{ABSTAIN_ANSWER}<|im_end|>"
    excluded_prompt, excluded_target = text[("q1", "excluded")]
    assert "Alexander Fleming" not in excluded_prompt and excluded_target == f"{ABSTAIN_ANSWER}<|im_end|>"
    assert {kind for _, kind in text} <= {"answer", "missed", "impossible", "excluded"}


def _tiny_base(folder: Path, seed: int) -> Path:
    """A 1-layer, 16-wide random Llama with SmolLM2's tokenizer: trains in a second."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(_prepared_model()))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, initializer_range=0.5,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _dataset(folder: Path, tokenizer_model: Path) -> Path:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_model))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pairs = [
        ("Who discovered it? Fleming did.", "Fleming [1]", "answer", False),
        ("Who?", ABSTAIN_ANSWER, "impossible", False),
    ]
    pairs += [("When? In 1928.", "1928 [1]", "answer", True), ("Why?", ABSTAIN_ANSWER, "impossible", True)]
    folder.mkdir()
    with gzip.open(folder / "examples.jsonl.gz", "wt") as handle:
        for n, (prompt, target, kind, heldout) in enumerate(pairs):
            row = {"qid": f"q{n}", "kind": kind, "prompt": tokenizer.encode(prompt), "heldout": heldout}
            row |= {"target": [*tokenizer.encode(target), end], "answers": [target.split(" [")[0]]}
            handle.write(json.dumps(row) + "\n")
    (folder / "data.json").write_text(json.dumps({"decline": ABSTAIN_ANSWER}))
    return folder


@pytest.mark.slow  # trains and merges a test model
def test_training_merging_and_a_mismatched_base(tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from indexer.tune.generator_model import GeneratorTrainOptions, train_adapter
    from ragserve.generate.adapter import read_adapter
    from ragserve.generate.model_prep import prepare_merged

    base = _tiny_base(tmp_path / "base", seed=0)
    data = _dataset(tmp_path / "data", base)
    options = GeneratorTrainOptions(epochs=20, batch_size=2, lr=0.1, rank=8, alpha=16, dropout=0.0, checkpoint_every=10)
    manifest = train_adapter(data, str(base), tmp_path / "adapter", options, "tiny", progress=False)
    losses = manifest["training"]
    assert losses["examples"] == 2 and sum(losses["last_losses"]) < sum(losses["first_losses"]) - 5.0  # 1 nat each
    assert manifest["heldout"]["answerable"] == 1 and manifest["heldout"]["unanswerable"] == 1
    adapter = read_adapter(tmp_path / "adapter")
    assert adapter.base_digest == manifest["base_digest"]
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base)), str(adapter.folder))  # loads

    merged = prepare_merged(base, adapter.folder, tmp_path / "merged")
    before, after = load_file(str(base / "model.safetensors")), load_file(str(merged / "model.safetensors"))
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    assert any("q_proj" in name for name in changed) and any("down_proj" in name for name in changed)
    assert json.loads((merged / "ragserve-prepared.json").read_text())["adapter_digest"] == adapter.digest

    other = _tiny_base(tmp_path / "other", seed=1)
    with pytest.raises(ConfigError, match="trained on base weights"):
        prepare_merged(other, adapter.folder, tmp_path / "merged-other")
    assert not (tmp_path / "merged-other").exists()


def test_a_folder_that_is_not_an_adapter_is_refused(tmp_path: Path) -> None:
    from ragserve.generate.adapter import read_adapter

    with pytest.raises(ConfigError, match="not a generator adapter"):
        read_adapter(tmp_path)


def test_the_adapter_setting_picks_the_served_folder() -> None:
    from ragserve.config import merged_generator_path
    from ragserve.config.base import SHIPPED_ADAPTER

    assert GeneratorSettings(adapter="none").resolved_model() == str(default_generator_path())
    shipped = GeneratorSettings().resolved_model()
    assert shipped == str(merged_generator_path(default_generator_path(), SHIPPED_ADAPTER))
    assert (SHIPPED_ADAPTER / "ragserve-adapter.json").is_file()
    # A configured model is served as configured unless an adapter is named for it.
    assert GeneratorSettings(model="/srv/m").resolved_model() == "/srv/m"
    assert GeneratorSettings(model="/srv/m", adapter="/srv/a").resolved_model().endswith("m+a")


def test_ask_prints_a_decline_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    from ragserve.cli.printing import print_final
    from ragserve.v1 import rag_pb2 as pb

    print_final(pb.FinalEvent(finish_reason="stop", declined=True), 0.1)
    assert "declined: the retrieved documents do not contain the answer" in capsys.readouterr().out
    print_final(pb.FinalEvent(finish_reason="stop"), 0.1)
    assert "declined" not in capsys.readouterr().out


def test_the_adapter_is_part_of_the_model_identity() -> None:
    """The answer cache keys on the served model's name and folder digest: a merged adapter
    changes both, so answers of the base model are never replayed for the tuned one."""
    from ragserve.generate.vllm_engine import VllmGenerator

    tuned, base = VllmGenerator(GeneratorSettings()), VllmGenerator(GeneratorSettings(adapter="none"))
    assert tuned.model_id.endswith("+smollm2-squad2-grounded") and base.model_id == "SmolLM2-135M-Instruct"
    assert tuned.model_id in tuned.answer_identity and tuned.answer_identity != base.answer_identity


@pytest.mark.slow  # trains a test model twice
def test_an_interrupted_training_resumes_from_its_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from indexer.tune import generator_model
    from indexer.tune.generator_model import GeneratorTrainOptions, train_adapter

    base = _tiny_base(tmp_path / "base", seed=0)
    data = _dataset(tmp_path / "data", base)
    options = GeneratorTrainOptions(epochs=3, batch_size=1, rank=2, alpha=4, checkpoint_every=2)  # 6 steps
    real = generator_model.resumable_training

    class Killed(Exception):
        pass

    def kill_at_3(step: int) -> None:
        if step == 3:
            raise Killed

    def interrupted(*args: object, **kwargs: object) -> Path:
        return real(*args, **kwargs, on_step=kill_at_3)  # type: ignore[arg-type]

    monkeypatch.setattr(generator_model, "resumable_training", interrupted)
    with pytest.raises(Killed):
        train_adapter(data, str(base), tmp_path / "adapter", options, "tiny", progress=False)
    monkeypatch.setattr(generator_model, "resumable_training", real)
    manifest = train_adapter(data, str(base), tmp_path / "adapter", options, "tiny", progress=False)
    assert manifest["training"]["steps_this_run"] == 4  # steps 3-6: from the checkpoint after step 2
