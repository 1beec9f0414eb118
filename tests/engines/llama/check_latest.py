#!/usr/bin/env python3
"""End-to-end checks of kvshim on node-llama-cpp's latest release (3.22.1, llama.cpp v0.5.0),
installed beside the pinned 3.21.1 by the same `npm ci` (the npm workspace latest/): the core
prefix cache and state adapter scenarios of check_prefix.py and check_kvshim.py, run unchanged
on the latest release, one case per ctest test (label e2e). The engines are the same
unmodified programs: every `node` gets NODE_OPTIONS=--import=latest/redirect.mjs (each import of
"node-llama-cpp" resolves to latest/node_modules), and the CLI is latest's own
(`node latest/node_modules/node-llama-cpp/dist/cli/cli.js` where the drivers run
`npx node-llama-cpp`). Before the case, version.mjs must report 3.21.1 / v0.4.0 without the
redirect and 3.22.1 / v0.5.0 with it. Outputs must be exactly those of the same engine on the
same release without kvshim, as in the pinned cases.

  prefix-cli   check_prefix.py cli: the unmodified CLI, B restores A's prefix from `kvshim serve`
               (batches 2048 and the default 512); B's completion == B without kvshim
  prefix-app   check_prefix.py app: three sequences of one context, prompts sharing the prefix
  state-peer   check_kvshim.py peer: app.mjs B restores A's saved prefix state through the peer
               protocol while A is alive; tokens == the --no-cache reference

Usage: check_latest.py CASE --preload LIBKVSHIM --kvshim CLI [--work-dir DIR] [--keep]
                       [--no-setup] [--asan-runtime LIBASAN]      (--list: the cases)
Exit status: 0 pass, 1 fail, 77 skipped (no Node.js >= 20 or no npm registry), 2 bad usage.
"""
import json
import os
import subprocess
import sys

from llama_e2e import HERE  # noqa: E402 (puts tests/lib on sys.path)
from harness import Failure, Skip, check  # noqa: E402
import check_kvshim  # noqa: E402
import check_prefix  # noqa: E402
import llama_e2e  # noqa: E402

LATEST = os.path.join(HERE, "latest")
REDIRECT = os.path.join(LATEST, "redirect.mjs")
LATEST_CLI = os.path.join(LATEST, "node_modules", "node-llama-cpp", "dist", "cli", "cli.js")
VERSION = os.path.join(HERE, "version.mjs")
PINNED = {"node_llama_cpp": "3.21.1", "llama_cpp": "v0.4.0"}
WANT = {"node_llama_cpp": "3.22.1", "llama_cpp": "v0.5.0"}
NPX = ["npx", "--no-install", "node-llama-cpp"]


def versions(env):
    p = subprocess.run(["node", VERSION], cwd=HERE, env=env, capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise Failure("version.mjs exited %d:\n%s" % (p.returncode, p.stderr[-2000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


class Latest:
    """Mixed in before a driver's context: its engines run on the latest release."""

    def __init__(self, args, tmp, work):
        super().__init__(args, tmp, work)
        if not os.path.isfile(LATEST_CLI):
            raise Skip("tests/engines/llama/latest/node_modules is not installed "
                       "(run scripts/llama-setup)")
        plain = {k: v for k, v in self.env(preload=False).items() if k != "NODE_OPTIONS"}
        check(versions(plain) == PINNED, "without the redirect: %s, expected %s"
              % (versions(plain), PINNED))
        got = versions(self.env(preload=False))
        check(got == WANT, "with latest/redirect.mjs: %s, expected %s" % (got, WANT))
        llama_e2e.say("engines run on node-llama-cpp %(node_llama_cpp)s (llama.cpp %(llama_cpp)s)"
                      % got)

    def env(self, preload=True, **extra):
        extra.setdefault("NODE_OPTIONS", "--import=" + REDIRECT)
        return super().env(preload, **extra)

    def spawn(self, argv, env, *a, **kw):
        if list(argv[:len(NPX)]) == NPX:
            argv = ["node", LATEST_CLI] + list(argv[len(NPX):])
        return super().spawn(argv, env, *a, **kw)


class PrefixCase(Latest, check_prefix.Case):
    pass


class StateCase(Latest, check_kvshim.Case):
    pass


def case_prefix_cli(c):
    check_prefix.case_cli(c)


def case_prefix_app(c):
    check_prefix.case_app(c)


def case_state_peer(c):
    check_kvshim.case_peer(c)


def context(args, tmp, work):
    return (StateCase if args.case.startswith("state") else PrefixCase)(args, tmp, work)


if __name__ == "__main__":
    sys.exit(llama_e2e.main(globals(), context, "--preload", "--kvshim", asan=True))
