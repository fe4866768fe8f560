"""labkit: the small toolkit behind the Inference Engineering Lab's notebooks.

One module per concept, grouped by concern: ``hardware/`` (the machine), ``llm/`` (how a model
works and what it costs), ``serving/`` (clients, metrics, load generation, engines), ``media/``
(speech, images, VLM and TTS arithmetic); ``settings``, ``paths``, ``models``, ``checks``,
``chapters`` and ``cli`` at the top. Each module's docstring names the chapter that teaches it.
Importing ``labkit`` is cheap: heavy libraries (torch, transformers) load inside functions.
"""

__version__ = "0.1.0"
