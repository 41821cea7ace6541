"""File mechanics every layer uses: atomic writes (temp file, fsync, rename), the allow-listed
unpickler for numpy RNG states (with the bounds that keep a crafted checkpoint from hanging a reader),
the bounded readers of the files users hand us (regular files only; YAML, JSON lines, .npy), and the
crash points the kill tests arm.

Imports: `errors` only.
"""
