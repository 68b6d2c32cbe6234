"""The sweep: ladder -> search -> confirm -> the run folder (rayrl.sweep.run.run).

``ladder`` and ``confirm`` hold the phases' rules as pure functions (no Ray); ``phases`` runs each
phase as a Tune experiment; ``run`` chains them and writes the summary; ``cli`` is
`experiments/sweep.py`.
"""
