"""What a run reports: timestamped console lines, the live status line, the TensorBoard writer.
The training loop writes through it, so it sits below `train`; the web page is `webui`, above it.

Imports: `config`, `files`, `errors` (the run record writes the resolved configuration).
"""
