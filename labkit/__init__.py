"""labkit: the small toolkit behind the Inference Engineering Lab's notebooks.

One module per concept, grouped by concern: ``hardware/`` (the machine), ``llm/`` (how a model
works and what it costs), ``serving/`` (clients, metrics, load generation, engines), ``media/``
(speech, images, VLM and TTS arithmetic); ``settings``, ``paths``, ``models``, ``checks``,
``chapters`` and ``cli`` at the top. Each module's docstring names the chapter that teaches it.
Importing ``labkit`` is cheap: heavy libraries (torch, transformers) load inside functions.
"""

import logging

__version__ = "0.1.0"

# transformers imports torchao (chapter 06's quantization library) on every model load; its CUDA-only
# extensions and torch's pytree deprecations would print several lines in every chapter on a CPU.
for _name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
