"""The configuration: the schema builder (unknown keys and wrong types refused by name), the model
and training dataclasses with their ranges, YAML loading, the model family type (family.py: what
differs between IndexTTS2 and IndexTTS-2.5, as data), and the constants of both families.

Imports: `errors`, `files`.
"""
