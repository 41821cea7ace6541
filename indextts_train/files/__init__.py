"""File mechanics every layer uses: atomic writes (temp file, fsync, rename), the allow-listed
unpickler for numpy RNG states, and the crash points the kill tests arm.

Imports: `errors` only.
"""
