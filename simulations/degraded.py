"""The dishonest model node's model for audit tests and demonstrations (issue 14; docs/committee.md
"Audits: running a verifier with audits").

``python -m simulations.degraded`` prints the path of a GGUF file that a dishonest node can serve
under the default model's id: the default SmolLM2-135M-Instruct Q4_1 GGUF re-quantized to Q2_K by
llama.cpp's own quantizer (:func:`simulations.measure_scores.requantize_q2k`, cached in the
project's cache folder), linked under the default file's name (``SmolLM2-135M-Instruct.Q4_1.gguf``
in ``CACHE/dishonest/``), so that ``gentorrent model-node --model PATH`` registers it as
``smollm2-135m-instruct``: a node claiming the expensive model while running a cheaper one. Never
serve it to users.
"""

from __future__ import annotations

import sys
from pathlib import Path

from model_node.llama import SMOLLM2_FILE, smollm2_path
from simulations.measure_scores import cache_dir, requantize_q2k


def dishonest_model() -> Path:
    """The Q2_K re-quantization of the default model, under the default model's file name (made
    once, then reused)."""
    q2k = requantize_q2k(smollm2_path())
    link = cache_dir() / "dishonest" / SMOLLM2_FILE
    link.parent.mkdir(parents=True, exist_ok=True)
    if not (link.is_symlink() and link.resolve() == q2k.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(q2k)
    return link


def main() -> int:
    print(dishonest_model())
    return 0


if __name__ == "__main__":
    sys.exit(main())
