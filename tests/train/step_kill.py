"""A training run "killed" after a given step, for the resume tests: a callback raises where SIGKILL would land,
after the step was logged, so nothing after it runs."""


class Killed(Exception):
    """Stands in for SIGKILL after a step was logged."""


def kill_at(step: int):
    def callback(info):
        if info.step == step:
            raise Killed(step)

    return callback
