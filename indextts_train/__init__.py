"""indextts-train: crash-proof fine-tuning of the IndexTTS2 UnifiedVoice GPT."""

__version__ = "0.1.0"
