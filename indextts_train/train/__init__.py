"""Training: setup from options, the loop, one step, the optimizer set, validation and evaluate,
best/milestones, the divergence guard, resume, hardware plan and memory model, the run lock.

Imports: every layer below (`ui`, `checkpoint`, `data`, `model`, `text`, `config`, `distributed`,
`files`, `errors`); never `prepare`: the two have no order between them (pyproject.toml's contract
says they are independent), and the demo, which uses both, sits beside the CLI (`demo.py`).
"""
