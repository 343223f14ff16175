"""The rollout notary's torch-free half: rollout records read and checked, the gap between an
engine's claimed logprobs and ours in each RL framework's own metric names, and the HTML page.
The scoring itself runs in the engine (engine/rollout_scoring.py); this layer imports only common."""
