from __future__ import annotations
def learner_class(name):
    if name == "PPO":
        from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner as L
    elif name == "APPO":
        from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner as L
    else:
        from ray.rllib.algorithms.impala.torch.impala_torch_learner import IMPALATorchLearner as L
    return L
def learner_settings(spec):
    return {"precision": spec.precision.mode, "accumulation_steps": spec.precision.accumulation_steps}
