"""GSM8K with lm-eval against a running server (`evaluate`): the project's task, the API chosen
by the model's chat template, per-question correctness for paired comparisons.

Reads lm-eval's output folder (serve/{arm}/lm_eval/, written during the serve job); writes
results/{cell}/gsm8k/{arm}.json (gsm8k.schema.json, checksummed).
"""
