"""What the node-llama-cpp e2e drivers (check_baseline.py, check_kvshim.py, check_prefix.py)
share on top of tests/lib/harness.py: paths, the setup step, the tiny model, the prompt text,
the options and main(). prefix_ab.sh writes its prompts with text() too."""
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import harness  # noqa: E402
from harness import Skip  # noqa: E402

TINY_GGUF = os.path.join(ROOT, "scripts", "tiny-gguf")
SETUP = os.path.join(ROOT, "scripts", "llama-setup")
LIBDIR = os.path.join(HERE, "node_modules", "@node-llama-cpp", "linux-x64", "bins", "linux-x64")

WORDS = ("the of and to a in is it you that he was for on are with as his they be at one have "
         "this from or had by hot word but what some we can out other were all there when up "
         "use your how said an each she which do their time if will way about many then them "
         "write would like so these her long make thing see him two has look more day could go "
         "come did number sound no most people my over know water than call first who may down "
         "side been now find any new work part take get place made live where after back little "
         "only round man year came show every good me give our under name").split()


def say(msg):
    print(msg, flush=True)


def text(seed, n):
    """n English-like words, the same for the same seed."""
    r = random.Random(seed)
    return " ".join(r.choice(WORDS) for _ in range(n))


def setup(args, skip_without_modules=True):
    """scripts/llama-setup (Skip when this machine cannot run node-llama-cpp); with --no-setup,
    Skip when node_modules is not installed (unless skip_without_modules is False)."""
    if not args.no_setup:
        harness.setup_step([SETUP])
    elif skip_without_modules and not os.path.isdir(os.path.join(HERE, "node_modules",
                                                                 "node-llama-cpp")):
        raise Skip("tests/engines/llama/node_modules is not installed (run scripts/llama-setup)")


def tiny_model(path, model, seed=None):
    """scripts/tiny-gguf writes a model of shape model (dict: flag name -> value) to path."""
    flags = []
    for k, v in model.items():
        flags += ["--" + k.replace("_", "-"), str(v)]
    seed_flags = [] if seed is None else ["--seed", str(seed)]
    subprocess.run([sys.executable, TINY_GGUF, "-q", "--out", path] + seed_flags + flags,
                   check=True)
    return path


def main(namespace, context, *required, asan=False):
    """harness.main over the case_* functions of a driver's namespace (globals()), keep-going
    mode, its docstring's options plus `required`, --no-setup and with asan --asan-runtime."""
    ap = harness.parser(namespace["__doc__"], *required, asan=asan)
    ap.add_argument("--no-setup", action="store_true", help="do not run scripts/llama-setup")
    return harness.main(harness.cases(namespace), ap, context, keep_going=True)
