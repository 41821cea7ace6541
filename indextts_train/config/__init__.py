"""The configuration: the schema builder (unknown keys and wrong types refused by name), the model
and training dataclasses with their ranges, YAML loading, and the constants of both families.

Imports: `errors`, `files`.
"""
