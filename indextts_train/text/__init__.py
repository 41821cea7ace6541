"""Text and vocabularies: SentencePiece and tiktoken files, growing a tokenizer, the vocabulary plan
(base rows, new rows, the extra row), and text presented the way official inference presents it.

Imports: `config`, `files`, `errors`.
"""
