"""The probe's short protocol for tests against a real server (the full 128-token ladder runs
in `batchproof witness`): 24 greedy tokens over the ladder 1, 4, 8."""

SHORT_MATRIX = """
protocol:
  n_predict: 24
  sampler: {temperature: 0.0, seed: 0, ignore_eos: true}
ladder:
  declared: [1, 4, 8]
witness:
  min_agree_tokens: 16
  max_constant_run: 16
"""
