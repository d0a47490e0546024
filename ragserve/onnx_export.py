"""torch -> ONNX export and int8 dynamic quantization of BERT-shaped models.

Shared by the ONNX query embedder and the ONNX cross-encoder. Each keeps its own cache folder
layout and its own way of publishing a finished export atomically; this module only writes the
files it is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def keyword_inputs(model: Any, output: str) -> Any:
    """`model` as a module called positionally with BERT_INPUTS, returning its `output` field.

    Keyword call: the positional order of forward() differs between transformers releases.
    """
    import torch

    class _KeywordCall(torch.nn.Module):  # type: ignore[misc]  # torch is not followed by mypy (pyproject)
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return getattr(out, output)

    return _KeywordCall().eval()


def export_bert(module: Any, path: Path, output: str, output_axes: dict[int, str]) -> None:
    """Export `module` (called with BERT_INPUTS) to `path`; batch size and sequence length stay dynamic."""
    import torch

    sample = torch.ones((2, 16), dtype=torch.long)
    axes = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(
            module,
            (sample, torch.ones_like(sample), torch.zeros_like(sample)),
            str(path),
            input_names=list(BERT_INPUTS),
            output_names=[output],
            dynamic_axes={**{name: axes for name in BERT_INPUTS}, output: output_axes},
            opset_version=17,
            dynamo=False,  # the TorchScript exporter needs no extra packages and handles BERT well
        )


def quantize_int8(source: Path, target: Path, per_channel: bool) -> None:
    """Dynamic int8 quantization of the weights (activations are quantized at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=per_channel)
