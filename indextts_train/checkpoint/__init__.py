"""Checkpoints: the file format and its migrations (state), save/load/verify/list, rotation,
repair of old or community files, export to the official layout, the asynchronous writer.

Imports: `data`, `model`, `text`, `config`, `files`, `errors`.
"""
