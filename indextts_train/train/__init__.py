"""Training: setup from options, the loop, one step, the optimizer set, validation and evaluate,
best/milestones, the divergence guard, resume, hardware plan and memory model, the run lock, and
the demo.

Imports: every layer below (`ui`, `checkpoint`, `data`, `prepare`, `model`, `text`, `config`,
`distributed`, `files`, `errors`).
"""
