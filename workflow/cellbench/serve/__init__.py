"""The serve stage (serve and compare rules): the servers (`server`; `tf_serve` and
`experts_tf` for transformers on the local runtime; `timed_server`, the test stand-in), the load
generator (`loadgen`, with the load shapes of cellbench.contracts; its prompts,
`random_prompts`, and its HTTP client, `sse_client`), the points observed (`observed_point`;
what a point means and its per-request file are cellbench.contracts'), GPU telemetry and
server metrics (`telemetry`, `server_metrics`), the tuned arm's evidence (`moe_evidence`) and
the job itself: `job` (what it measures, `StageConfig`, checked once), `args` (its command
line), `measure` (the grid against live servers, interleaved repeats, GSM8K per server start,
the tuned arm's MoE check) and `stage` (a job from start to bench.json, for an arm, a pair or
two images).

Reads the cell's model, its tuned configs (results/{cell}/tune/configs/) and the image pin;
writes results/{cell}/serve/{arm}/bench.json (bench.schema.json), server.log and lm_eval/, and
for image comparisons results/compare/.../bench.json (compare.schema.json).
"""
