"""`indextts-train listen`: synthesize fixed lines from checkpoints with the official inference code, then
transcribe and score them.

Synthesis runs the official packages (`indextts2-inference`, `indextts25-inference`, or an index-tts
checkout) in a child process of their own interpreter, with files in and out (`synthesize.py`,
`child_infer.py`); the model folder it reads is the user's with the exported files swapped in
(`model_folder.py`).

Imports: `prepare`, `ui`, `checkpoint`, `data`, `model`, `text`, `config`, `files`, `errors`; above it
`train`, `webui` and `cli` may call it (train only through a separate process).
"""
