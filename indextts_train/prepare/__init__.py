"""From audio clips and transcripts to the arrays and manifests the trainer reads (`indextts-train prepare`):
corpus readers, the two official audio paths, w2v-BERT layer 17, the codecs, CAMPPlus, pairs, the
resumable pipeline. Its third-party libraries (transformers, soundfile, soxr, ...) are the
`[prepare]` extra, imported only here.

Imports: `ui` (durations), `checkpoint` (its bounded reader, for gpt.pth), `data`, `model`, `text`,
`config`, `distributed`, `files`, `errors`; never `train` (independent layers); `demo.py` and `cli.py` call it.
"""
