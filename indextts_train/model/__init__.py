"""The UnifiedVoice GPT of both families, sized by its config dataclass: the trunk and heads, the
losses, the official `gpt.pth` key layout, LoRA adapters and train scopes, and the carried
conditioning/emotion encoders.

Imports: `text`, `config`, `files`, `errors`.
"""
