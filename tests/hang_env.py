"""An env factory whose step() blocks forever once, on whichever EnvRunner first reaches step 200:
the hung-runner watchdog's test. A marker file (env_config["marker"]) makes it happen exactly once,
so the runner Ray restarts samples normally again."""

import os
import threading

import gymnasium as gym


class HangOnce(gym.Wrapper):
    def __init__(self, env: gym.Env, marker: str, after: int) -> None:
        super().__init__(env)
        self.marker, self.after, self.steps = marker, after, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.after:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                threading.Event().wait()  # blocks forever, like a simulator that stopped answering
        return self.env.step(action)


def make(env_config: dict):
    return HangOnce(gym.make("CartPole-v1"), env_config["marker"], int(env_config.get("after", 200)))
