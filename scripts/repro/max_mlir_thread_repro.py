"""Direct reproduction, without a GPU, of MAX 26.7.0's precompiled-artifact lookup failing on a
worker thread: ``InferenceSession(precompiled_mefs=...).load(graph)`` names the graph's artifact
with ``max.engine._precompiled_mefs._default_key``, which reads the graph's input types; MAX's MLIR
context is thread-local and entered at import on the main thread only, so on any other thread that
read raises ``RuntimeError: No active MLIR context`` (H100, 2026-11-28: every property of a check,
whose kernel calls run on a worker thread). Inside ``ensure_default_mlir_context()`` it works.

    PYTHONPATH=SITE python3 scripts/repro/max_mlir_thread_repro.py    # SITE: max==26.7.0 installed
"""

from __future__ import annotations

import threading

from max import graph as g
from max._mlir_context import ensure_default_mlir_context
from max.dtype import DType
from max.engine._precompiled_mefs import _default_key


def build() -> g.Graph:
    with g.Graph("repro", input_types=[g.TensorType(DType.float32, [4], g.DeviceRef.CPU())]) as graph:
        graph.output(graph.inputs[0].tensor + 1)
    return graph


def key_on_a_worker(entered: bool) -> str:
    result: list[str] = []

    def work() -> None:
        graph = build()
        try:
            if entered:
                with ensure_default_mlir_context():
                    result.append(_default_key(graph))
            else:
                result.append(_default_key(graph))
        except RuntimeError as exc:
            result.append(f"RuntimeError: {exc}")

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return result[0]


if __name__ == "__main__":
    print("main thread:                         ", _default_key(build()))
    print("worker thread:                       ", key_on_a_worker(entered=False))
    print("worker, ensure_default_mlir_context: ", key_on_a_worker(entered=True))
