"""Evaluation, inference and latency, apart from the training recipe (the trainer only calls `accuracy.evaluate`).

accuracy.py    exact top-1/top-5 over every validation image once, on all ranks; a checkpoint's accuracy
inference.py   the `--optimize` modes: batch-1 runners (fp16/bf16, CUDA graphs, compile, int8, ONNX Runtime)
latency.py     the DAWNBench batch-1 latency protocol, and the inference entry it writes
cli.py         what `evaluate.py` does with its arguments
"""
