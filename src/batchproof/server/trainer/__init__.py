"""The trainer's routes, each through the backend's WeightControl (engine_client.py) and a 501
where it has none (a fleet's router): the control plane, /weight_info, /is_paused, /pause, /resume
and /abort_requests (control.py); POST /v1/load_weights (load_weights.py), reading only under
--weights-root (weights_root.py); and the rollout notary, POST /v1/verify_rollouts
(verify_rollouts.py)."""
