"""labkit: the small toolkit behind the Inference Engineering Lab's notebooks.

One module per concept, grouped by role, from the bottom layer up: ``settings``/``paths``,
``hardware/`` (the machine), ``models`` (the bundled weights), ``llm/`` (how a model works and what
it costs), ``media/`` (speech, images, VLM and TTS), ``serving/`` (clients and measurement: streams,
request records, metrics, load generation), ``engines/`` (real servers: vLLM, the scripted server,
their ``/metrics``), ``production/`` (chapter 08: batching, fleets, cold starts, cost, deploy,
monitor); ``results``, ``report/``, ``chapters``, ``checks``, ``jupyter``, ``cli`` and
``gpucheck`` on top. A lower layer never imports a higher one (tests/test_layout.py). Each
module's docstring names the chapter that teaches it.
Importing ``labkit`` is cheap: heavy libraries (torch, transformers) load inside functions.
"""

import logging

__version__ = "0.1.0"

# transformers imports torchao (chapter 06's quantization library) on every model load; its CUDA-only
# extensions and torch's pytree deprecations would print several lines in every chapter on a CPU.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
