"""Extractive reading: a span head over (question, passage) pairs that finds the answer span in a
passage, or says the passage holds none (SQuAD 2.0 style). `base.py` holds the `Reader` contract,
`onnx_reader.py` the ONNX Runtime implementation and `default/` the reader the project ships."""
