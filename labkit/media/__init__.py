"""Beyond LLMs: Whisper ASR and word error rate, SDXL diffusion and its digits stand-in, VLM and TTS
arithmetic (chapter 07)."""
