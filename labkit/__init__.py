"""labkit: the small toolkit behind the Inference Engineering Lab's notebooks.

One module per concept; each module's docstring names the chapter that teaches it.
Importing ``labkit`` is cheap: heavy libraries (torch, transformers) load inside functions.
"""

__version__ = "0.1.0"
