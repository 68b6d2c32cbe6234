"""An env factory that always fails: used to make a sweep's first rung fail on purpose."""


def make(env_config: dict):
    raise RuntimeError("broken_env: this env always fails to build (a test fixture)")
