"""Training data: manifests (both forms, both families), the index and its fingerprint, the resumable
sampler, collate, data workers, check-data, and the demo's synthetic datasets.

Imports: `model`, `text`, `config`, `files`, `errors` (never `prepare`).
"""
