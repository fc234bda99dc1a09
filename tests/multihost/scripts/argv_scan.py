"""Whether a value shows in any process's command line on this machine: plainly, or inside the
environment of a dslaunch plan (an agent's ``--plan`` word). The fake hosts share one PID space,
so this sees every host's agents."""
import glob

from dslaunch.launcher.plan import WorldPlan


def shown_in_some_argv(value: str) -> bool:
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as f:
                words = f.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        if any(value in w for w in words):
            return True
        if "--plan" in words[:-1]:
            plan = WorldPlan.decode(words[words.index("--plan") + 1])
            if value in str(plan.env):
                return True
    return False
