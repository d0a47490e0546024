"""Export a float model folder as W8A8 int8 (compressed-tensors), the format vLLM's CPU backend
runs through oneDNN's int8 kernels. Run by `ragserve prepare-models --int8` with the interpreter
of an environment of its own (model_prep.py `quantize_environment`): llmcompressor pins
transformers and compressed-tensors versions vLLM's do not match. It imports nothing of ragserve.

    python int8_export.py SOURCE_FOLDER TARGET_FOLDER

Data-free: int8 weights per output channel, activations quantized per token at run time (no
calibration set is needed); `lm_head` stays in float (its output is the logits).
"""

from __future__ import annotations

import sys


def main(source: str, target: str) -> None:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(source)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"]))
    model.save_pretrained(target, save_compressed=True)
    tokenizer.save_pretrained(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
