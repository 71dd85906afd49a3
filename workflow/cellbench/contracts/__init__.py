"""What every stage's results mean and how they are read and written, shared by the stages
(above `common` and `stats`, below every stage): a stage sees these, never another stage's
internals.

`result_file` (one result file: its kind, the refusal `ResultError`, reading it against its
checksum, and one schema check per kind that the writing stage and the loaders both call),
`load_shapes` (the load shapes of the serve grid, goodput under SLOs), `point` (a point's key
across repeats and sides, and the figures observed around it), `request_detail` (the
per-request sidecar beside bench.json), `validity` (when a repeat cannot count), `capacity`
(what a capacity search's probes mean: the bracket rule, the two arms compared) and
`gsm8k_dataset` (which GSM8K question set a config names).
"""
